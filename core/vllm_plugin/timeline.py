"""A per-request timeline of the P/D path: one JSON line per event, in the file HYBRIDSERVE_TIMELINE_FILE names.

Off unless the variable is set (then nothing is patched and nothing costs). Every vLLM process of both roles and
the proxy append to the one file (one `os.write` of one line each, O_APPEND), stamped with `time.time()` so lines
of different processes on one host compare. core/chaos/timeline_gaps.py joins them per request.

Events, where each is stamped (vLLM 0.26 and 0.32 name these the same; a name that is missing is logged once and
that event stays off, serving is never touched):
- `arrive`: the engine's `Scheduler.add_request` (both roles; `role` from the request's kv_transfer_params).
- `alloc`: NixlPullConnectorScheduler.update_state_after_alloc: decode allocated the blocks the READ will fill.
- `post_start` / `posted`: around the worker's `_read_blocks` (NIXL make_prepped_xfer + transfer), on the step
  thread.
- `nixl_done`: the worker's `_pop_done_transfers` poll that first finds every handle of the request DONE.
- `recv_seen`: the scheduler's `_update_from_kv_xfer_finished` taking the request's finished_recving.
- `scheduled`: the first `Scheduler.schedule` output that gives the request tokens to compute (prefill: its
  forward; decode: the recompute of the last prompt token once the KV is in place).
- `first_token` / `finished`: `Scheduler.update_from_output` returns the request's first new token / its finish.
- proxy (core/proxy/app.py): `hop1_start`, `hop1_end`, `hop2_start`, `hop2_first_byte`, keyed by X-Request-Id;
  core/proxy/failover.py: `retry` (role, failed and next server, whether prefill's blocks were kept) and `fallback`
  (the role that served the request alone), each time it happens.
- `peer_released` (peer_release.py, not per request: `req` empty): a decode gave back a dead engine's NIXL state.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from hybridserve.core.common.contracts import TIMELINE_FILE_ENV as TIMELINE_FILE
from hybridserve.core.common.timeline_log import emit, open_file, path_from_env  # noqa: F401 (the plugin's __init__)
from hybridserve.core.vllm_plugin.import_hooks import after_import
from hybridserve.core.vllm_plugin.log import logger

SCHEDULER_MODULE = "vllm.v1.core.sched.scheduler"
PULL_SCHEDULER_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_scheduler"
PULL_WORKER_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_worker"
def _missing(cls: Any, *names: str) -> bool:
    absent = [n for n in names if not callable(getattr(cls, n, None))]
    if absent:
        logger.warning("hybridserve timeline: %s has no %s; those events stay off", cls.__name__, ", ".join(absent))
    return bool(absent)


def _role(request: Any) -> str:
    params = getattr(request, "kv_transfer_params", None) or {}
    return "decode" if params.get("do_remote_prefill") else "prefill" if params.get("do_remote_decode") else "single"


def patch_scheduler(module: ModuleType) -> None:
    cls = module.Scheduler
    if getattr(cls, "_hybridserve_timeline", False) or _missing(
            cls, "add_request", "schedule", "update_from_output", "_update_from_kv_xfer_finished"):
        return
    add, schedule, update, xfer = (cls.add_request, cls.schedule, cls.update_from_output,
                                   cls._update_from_kv_xfer_finished)

    def add_request(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        emit("arrive", request.request_id, role=_role(request), prompt_tokens=getattr(request, "num_prompt_tokens", None))
        return add(self, request, *args, **kwargs)

    def schedule_(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = schedule(self, *args, **kwargs)
        seen = self.__dict__.setdefault("_hybridserve_scheduled", set())
        for req_id, num in (getattr(out, "num_scheduled_tokens", None) or {}).items():
            if req_id not in seen:
                seen.add(req_id)
                emit("scheduled", req_id, tokens=num)
        return out

    def update_from_output(self: Any, *args: Any, **kwargs: Any) -> Any:
        outputs = update(self, *args, **kwargs)
        firsts = self.__dict__.setdefault("_hybridserve_first", set())
        scheduled = self.__dict__.get("_hybridserve_scheduled", set())
        for each in (outputs or {}).values():
            for out in getattr(each, "outputs", None) or ():
                if out.new_token_ids and out.request_id not in firsts:
                    firsts.add(out.request_id)
                    emit("first_token", out.request_id)
                if getattr(out, "finish_reason", None) is not None:
                    emit("finished", out.request_id)
                    firsts.discard(out.request_id), scheduled.discard(out.request_id)
        return outputs

    def update_from_kv_xfer_finished(self: Any, kv_connector_output: Any, *args: Any, **kwargs: Any) -> Any:
        for req_id in getattr(kv_connector_output, "finished_recving", None) or ():
            emit("recv_seen", req_id)
        return xfer(self, kv_connector_output, *args, **kwargs)

    cls.add_request, cls.schedule, cls.update_from_output = add_request, schedule_, update_from_output
    cls._update_from_kv_xfer_finished = update_from_kv_xfer_finished
    cls._hybridserve_timeline = True


def patch_pull_scheduler(module: ModuleType) -> None:
    cls = module.NixlPullConnectorScheduler
    if getattr(cls, "_hybridserve_timeline", False) or _missing(cls, "update_state_after_alloc"):
        return
    original = cls.update_state_after_alloc

    def update_state_after_alloc(self: Any, request: Any, blocks: Any, num_external_tokens: int) -> Any:
        if num_external_tokens:
            emit("alloc", request.request_id, external_tokens=num_external_tokens)
        return original(self, request, blocks, num_external_tokens)

    cls.update_state_after_alloc = update_state_after_alloc
    cls._hybridserve_timeline = True


def patch_pull_worker(module: ModuleType) -> None:
    cls = module.NixlPullConnectorWorker
    if getattr(cls, "_hybridserve_timeline", False) or _missing(cls, "_read_blocks", "_pop_done_transfers"):
        return
    read, pop = cls._read_blocks, cls._pop_done_transfers

    def _read_blocks(self: Any, *args: Any, **kwargs: Any) -> Any:
        req = kwargs.get("request_id", args[2] if len(args) > 2 else "?")
        emit("post_start", req)
        try:
            return read(self, *args, **kwargs)
        finally:
            emit("posted", req)

    def _pop_done_transfers(self: Any, transfers: dict, *args: Any, **kwargs: Any) -> Any:
        before = set(transfers)
        out = pop(self, transfers, *args, **kwargs)
        for req_id in before - set(transfers):
            emit("nixl_done", req_id)
        return out

    cls._read_blocks, cls._pop_done_transfers = _read_blocks, _pop_done_transfers
    cls._hybridserve_timeline = True


def install(path: str) -> None:
    open_file(path)
    after_import(SCHEDULER_MODULE, patch_scheduler)
    after_import(PULL_SCHEDULER_MODULE, patch_pull_scheduler)
    after_import(PULL_WORKER_MODULE, patch_pull_worker)
