"""Decode never answers from prefill blocks that may have been freed or reused: the scheduler side (issue 39).

When HYBRIDSERVE_LEASE_GUARD=1 (launch sets it on every engine), on vLLM 0.26 and 0.32:
- prefill, `NixlPullConnectorScheduler.request_finished`: the kv_transfer_params it answers with carry the end of
  the request's lease (core/common/kv_lease.py `STAMP_KEY`), from the deadline vLLM just set
  (`_reqs_need_send[request_id]`, its perf_counter plus kv_lease_duration) turned into Unix seconds;
- decode, `NixlConnectorMetadata.add_new_req_to_recv`: the stamp rides on the request's ReqMeta to the worker
  (lease_guard.py), which otherwise keeps only the fields vLLM knows;
- decode, `Scheduler._update_from_kv_xfer_finished`: a request a worker refused (`RefusedLoads` in the step's
  kv_connector_worker_meta) is computed again from its first token, as vLLM's own recompute policy does for a failed
  load (0.32 `_handle_failed_recving`, 0.26 `_update_requests_with_invalid_blocks`: num_computed_tokens = 0 and the
  id in failed_recving_kv_req_ids, so `_update_waiting_for_remote_kv` frees its blocks and the request is prefilled
  here). Whatever kv_load_failure_policy says: a refused READ is not a broken transfer but one the guard did not
  trust, and vLLM 0.26 has no failure path that is safe for a hybrid model (a failed hybrid receive is reported as
  received: vllm#52234);
- decode, `request_finished`: the answer of such a request says so in its kv_transfer_params (`REFUSED_KEY`).
"""

from __future__ import annotations

import time
from types import ModuleType
from typing import Any

from hybridserve.core.common.contracts import RECOMPUTED_LOG_PREFIX
from hybridserve.core.common.kv_lease import REFUSED, REFUSED_KEY, STAMP_KEY
from hybridserve.core.vllm_plugin.import_hooks import after_import
from hybridserve.core.vllm_plugin.lease_book import RefusedLoads
from hybridserve.core.vllm_plugin.lease_guard import STAMP_ATTR
from hybridserve.core.vllm_plugin.log import logger

SCHEDULER_MODULE = "vllm.v1.core.sched.scheduler"
PULL_SCHEDULER_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_scheduler"
METADATA_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata"
_MARK = "_hybridserve_lease_refused"  # in the decode request's own kv_transfer_params


def unix_stamp(deadline_perf: float, now_perf: float, now_unix: float) -> float:
    """A perf_counter deadline as Unix seconds (both clocks read at the same moment)."""
    return round(now_unix + (deadline_perf - now_perf), 3)


def patch_pull_scheduler(cls: Any) -> None:
    finished = cls.request_finished

    def request_finished(self: Any, request: Any, block_ids: Any) -> Any:
        delay, params = finished(self, request, block_ids)
        own = getattr(request, "kv_transfer_params", None) or {}
        if params is not None and params.get("do_remote_prefill") and delay:  # prefill: the blocks wait for a READ
            deadline = getattr(self, "_reqs_need_send", {}).get(request.request_id)
            if deadline is not None:
                params[STAMP_KEY] = unix_stamp(deadline, time.perf_counter(), time.time())
        elif params is None and own.get(_MARK):  # decode: the READ was refused, the prompt computed here
            params = {REFUSED_KEY: REFUSED}
        return delay, params

    cls.request_finished = request_finished
    cls._hybridserve_lease_guard = True


def patch_metadata(cls: Any) -> None:
    add = cls.add_new_req_to_recv

    def add_new_req_to_recv(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = add(self, *args, **kwargs)
        req_id = kwargs["request_id"] if "request_id" in kwargs else args[0]
        params = kwargs["kv_transfer_params"] if "kv_transfer_params" in kwargs else args[2]
        meta = self.reqs_to_recv.get(req_id)
        if meta is not None and isinstance(params, dict) and STAMP_KEY in params:
            setattr(meta, STAMP_ATTR, params[STAMP_KEY])
        return out

    cls.add_new_req_to_recv = add_new_req_to_recv
    cls._hybridserve_lease_guard = True


def recompute_refused(scheduler: Any, refused: frozenset[str], waiting: Any) -> list[str]:
    """Send each refused request waiting for its KV back to a local prefill; returns the ids it applied to."""
    applied = []
    for req_id in sorted(refused):
        request = scheduler.requests.get(req_id)
        if request is None or request.status != waiting:
            continue
        request.num_computed_tokens = 0
        scheduler.failed_recving_kv_req_ids.add(req_id)
        if isinstance(request.kv_transfer_params, dict):
            request.kv_transfer_params[_MARK] = True
        applied.append(req_id)
        logger.warning("%s %s: its READ was refused", RECOMPUTED_LOG_PREFIX, req_id)
    return applied


def patch_scheduler(module: ModuleType) -> None:
    cls = module.Scheduler
    update = cls._update_from_kv_xfer_finished
    waiting = module.RequestStatus.WAITING_FOR_REMOTE_KVS

    def _update_from_kv_xfer_finished(self: Any, kv_connector_output: Any) -> Any:
        found = getattr(kv_connector_output, "kv_connector_worker_meta", None)
        if isinstance(found, RefusedLoads):
            recompute_refused(self, found.req_ids, waiting)
        return update(self, kv_connector_output)

    cls._update_from_kv_xfer_finished = _update_from_kv_xfer_finished
    cls._hybridserve_lease_guard = True


def install() -> None:
    def once(name: str, patch: Any) -> Any:
        def apply(module: ModuleType) -> None:
            cls = getattr(module, name)
            if not getattr(cls, "_hybridserve_lease_guard", False):
                patch(module if patch is patch_scheduler else cls)
        return apply

    after_import(PULL_SCHEDULER_MODULE, once("NixlPullConnectorScheduler", patch_pull_scheduler))
    after_import(METADATA_MODULE, once("NixlConnectorMetadata", patch_metadata))
    after_import(SCHEDULER_MODULE, once("Scheduler", patch_scheduler))
