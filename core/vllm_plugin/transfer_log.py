"""Log, on the decode side, each request whose KV cache and GDN state arrived over NIXL.

vLLM only prints windowed transfer metrics every few seconds. This adds one line per request when its read
completes, with the blocks per KV-cache group kind, so a test or an operator can tell state that arrived over
NIXL from state that was recomputed:
`hybridserve: NIXL received request cmpl-... : attention 1 block(s), GDN state 3 block(s) in 4 group(s)`.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from hybridserve.core.common.contracts import RECEIVED_LOG_PREFIX
from hybridserve.core.vllm_plugin.import_hooks import after_import
from hybridserve.core.vllm_plugin.log import logger
from hybridserve.core.vllm_plugin.nixl_results import finished_recving, results_method

NIXL_PULL_WORKER_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_worker"


def _group_kinds(worker: Any) -> list[str]:
    groups = getattr(getattr(worker, "kv_cache_config", None), "kv_cache_groups", None) or []
    return ["GDN state" if "Mamba" in type(g.kv_cache_spec).__name__ else "attention" for g in groups]


def describe(kinds: list[str], block_ids: Any) -> str:
    """'attention 4 block(s), GDN state 3 block(s) in 4 group(s)' from per-group block id lists."""
    totals: dict[str, int] = {}
    for i, ids in enumerate(block_ids):
        kind = kinds[i] if i < len(kinds) else "group"
        totals[kind] = totals.get(kind, 0) + len(ids)
    parts = ", ".join(f"{kind} {n} block(s)" for kind, n in sorted(totals.items()))
    return f"{parts} in {len(block_ids)} group(s)"


def patch_worker_module(module: ModuleType) -> None:
    worker_cls = module.NixlPullConnectorWorker  # the default (pull) mode: D reads from P
    name = results_method(worker_cls)
    read, results = worker_cls._read_blocks_for_req, getattr(worker_cls, name)
    if getattr(read, "_hybridserve", False):
        return

    def _read_blocks_for_req(self: Any, req_id: str, meta: Any) -> Any:
        pending = self.__dict__.setdefault("_hybridserve_reads", {})
        pending[req_id] = describe(_group_kinds(self), getattr(meta, "local_block_ids", ()) or ())
        return read(self, req_id, meta)

    def step_results(self: Any) -> Any:
        out = results(self)
        pending = self.__dict__.get("_hybridserve_reads", {})
        for req_id in finished_recving(out):
            if req_id in pending:
                logger.info("%s %s: %s", RECEIVED_LOG_PREFIX, req_id, pending.pop(req_id))
        return out

    _read_blocks_for_req._hybridserve = True  # type: ignore[attr-defined]
    worker_cls._read_blocks_for_req = _read_blocks_for_req
    setattr(worker_cls, name, step_results)


def install() -> None:
    after_import(NIXL_PULL_WORKER_MODULE, patch_worker_module)
