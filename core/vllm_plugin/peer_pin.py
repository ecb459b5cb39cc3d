"""Decode keeps each live prefill's KV cache allocations open over cuda_ipc, so that a READ opens none (issue 38).

Why (H200, 2026-12-05, benchmarks/DETAILS.md "Served on the H200"): with UCX's cuda_ipc mapping cache off (launch's
decode, core/common/ucx.py: a dead prefill's memory must be given back) the post of one READ took 21.7-29.6 ms
against 3.2-5.8 ms with the cache on. Read in UCX's source (1.23.0-dev, the one inside nixl 1.5.1;
src/uct/cuda/cuda_ipc): with the cache off, cuda_ipc opens a remote allocation (cuIpcOpenMemHandle) when a READ's
descriptor first touches it and closes it once its copies complete, so every READ opens each of prefill's
allocations again (vLLM 0.26: one per KV cache tensor, 15 for the 60-layer model). An allocation that something
else holds open is only counted, not opened: a NIXL memory view (`prep_mem_view`) holds each allocation its
descriptors touch until `release_mem_view`.

On when HYBRIDSERVE_PIN_PEER_REGIONS=1 (launch sets it on CUDA decode engines, beside UCX_CUDA_IPC_CACHE=n), on
NixlPullConnectorWorker, for VRAM KV caches only:
- `add_remote_agent` (vLLM's handshake) is noted: the remote rank's device id, which the worker does not keep;
- before and after each `start_load_kv` (the step thread, where vLLM posts its READs, with the worker's CUDA device
  current) and while no handshake is in flight, each handshaken remote rank not yet pinned gets one view: one byte
  at each of its regions' bases;
- `_cleanup_remote_engine` (vLLM's TTL eviction and shutdown, and peer_release.py's release of a dead prefill)
  releases the engine's views first, so that removing its agent closes the allocations and gives the memory back.
A view that cannot be made is logged once for that rank and the rank is read unpinned, as before (slower, never
wrong).

Thread safety: the agent is not safe from two threads (nixl_poll.py). The views are made and released where vLLM
makes its own NIXL calls: on the step thread, and in `_cleanup_remote_engine`. peer_release's prober thread calls
that under its step lock, and the plugin patches peer_pin first, so peer_release's `start_load_kv` wrapper holds
the same lock around this one. A handshake's thread makes NIXL calls of its own, so no view is made while one is in
flight (vLLM's `_handshake_futures`, under its `_handshake_lock`). `add_remote_agent` (that thread) only notes a
device id here.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from hybridserve.core.common.contracts import PINNED_LOG_PREFIX, UNPINNED_LOG_PREFIX
from hybridserve.core.vllm_plugin.import_hooks import after_import
from hybridserve.core.vllm_plugin.log import logger

PULL_WORKER_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_worker"
PIN_BYTES = 1  # a view's descriptor: cuda_ipc opens the whole allocation behind it
VRAM = "VRAM"

Rank = tuple[str, int]  # (engine id, remote TP rank)


def pin_descs(bases: Iterable[int], device_id: int, agent_name: str) -> list[tuple[int, int, int, str]]:
    """One remote descriptor a region (duplicate bases once), in NIXL's (addr, len, device id, agent) form."""
    return [(int(base), PIN_BYTES, int(device_id), agent_name) for base in dict.fromkeys(bases)]


@dataclass
class Pins:
    """One worker's views, and what it learned at handshakes (bookkeeping only: the NIXL calls take the wrapper)."""

    devices: dict[Rank, int] = field(default_factory=dict)  # from add_remote_agent's metadata
    views: dict[Rank, int] = field(default_factory=dict)  # memory view handles
    unpinned: set[Rank] = field(default_factory=set)  # ranks whose view failed: read as before, not tried again

    def due(self, remote_agents: dict[str, dict[tuple[int, int], str]],
            bases: dict[str, dict[int, list[int]]]) -> list[tuple[Rank, str, list[int], int]]:
        """The ranks handshaken and complete but neither pinned nor failed: (rank, agent name, bases, device)."""
        out = []
        for engine_id, agents in list(remote_agents.items()):
            for (_, remote_rank), agent_name in list(agents.items()):
                rank = (engine_id, remote_rank)
                if rank in self.views or rank in self.unpinned or rank not in self.devices:
                    continue
                found = bases.get(engine_id, {}).get(remote_rank)
                if found:
                    out.append((rank, agent_name, list(found), self.devices[rank]))
        return out

    def take(self, engine_id: str) -> list[int]:
        """The engine's views, forgotten here (the caller releases them). Safe against a second caller: vLLM 0.26's
        shutdown cleans up without peer_release's lock."""
        handles = [h for rank in list(self.views) if rank[0] == engine_id
                   and (h := self.views.pop(rank, None)) is not None]
        for rank in [r for r in list(self.unpinned) if r[0] == engine_id]:
            self.unpinned.discard(rank)
        for rank in [r for r in list(self.devices) if r[0] == engine_id]:
            self.devices.pop(rank, None)
        return handles


def pins_of(worker: Any) -> Pins:
    found = worker.__dict__.get("_hybridserve_pins")
    if found is None:
        found = worker.__dict__["_hybridserve_pins"] = Pins()
    return found


def pin_due(worker: Any) -> list[Rank]:
    """Make a view for every handshaken rank not yet pinned, unless a handshake is in flight: its thread makes NIXL
    calls of its own (add_remote_agent, prep_xfer_dlist), and the pin waits a step, as peer_release's release does.
    Returns the ranks pinned now."""
    if getattr(worker, "nixl_memory_type", None) != VRAM:
        return []
    with worker._handshake_lock:  # a handshake's completion takes it: none lands while the views are made
        if worker._handshake_futures:
            return []
        return _pin(worker)


def _pin(worker: Any) -> list[Rank]:
    pins, wrapper, pinned = pins_of(worker), worker.nixl_wrapper, []
    for rank, agent_name, bases, device_id in pins.due(worker._remote_agents, worker.kv_caches_base_addr):
        descs, t0 = pin_descs(bases, device_id, agent_name), time.perf_counter()
        try:
            pins.views[rank] = wrapper.prep_mem_view(wrapper.get_remote_descs(descs, VRAM))
        except Exception as exc:  # noqa: BLE001 (unpinned READs still work: slower, never wrong)
            pins.unpinned.add(rank)
            logger.warning("%s %s rank %d (%s: %s); its READs open them each time", UNPINNED_LOG_PREFIX, rank[0],
                           rank[1], type(exc).__name__, exc)
            continue
        pinned.append(rank)
        logger.info("%s %s rank %d: %d regions in %.1f ms", PINNED_LOG_PREFIX, rank[0], rank[1],
                    len(descs), 1e3 * (time.perf_counter() - t0))
    return pinned


def unpin(worker: Any, engine_id: str) -> int:
    """Release the engine's views (before its agents are removed). Returns how many."""
    handles = pins_of(worker).take(engine_id)
    for handle in handles:
        try:
            worker.nixl_wrapper.release_mem_view(handle)
        except Exception:  # noqa: BLE001 (the agent's removal must still run)
            logger.warning("hybridserve: releasing a KV region view of remote engine %s failed", engine_id,
                           exc_info=True)
    return len(handles)


def patch_worker_module(module: ModuleType) -> None:
    worker_cls = module.NixlPullConnectorWorker
    add, start, cleanup = worker_cls.add_remote_agent, worker_cls.start_load_kv, worker_cls._cleanup_remote_engine
    if getattr(start, "_hybridserve_pin", False):
        return

    def add_remote_agent(self: Any, nixl_agent_meta: Any, remote_tp_rank: int = 0, *args: Any,
                         **kwargs: Any) -> Any:
        name = add(self, nixl_agent_meta, remote_tp_rank, *args, **kwargs)
        pins_of(self).devices[(nixl_agent_meta.engine_id, int(remote_tp_rank))] = int(nixl_agent_meta.device_id)
        return name

    def start_load_kv(self: Any, metadata: Any, *args: Any, **kwargs: Any) -> Any:
        pin_due(self)  # handshakes finished since the last step: pinned before their first READ
        try:
            return start(self, metadata, *args, **kwargs)
        finally:
            pin_due(self)

    def _cleanup_remote_engine(self: Any, engine_id: str, *args: Any, **kwargs: Any) -> Any:
        unpin(self, engine_id)
        return cleanup(self, engine_id, *args, **kwargs)

    start_load_kv._hybridserve_pin = True  # type: ignore[attr-defined]
    worker_cls.add_remote_agent = add_remote_agent
    worker_cls.start_load_kv = start_load_kv
    worker_cls._cleanup_remote_engine = _cleanup_remote_engine


def install() -> None:
    after_import(PULL_WORKER_MODULE, patch_worker_module)
