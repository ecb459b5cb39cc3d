"""Decode gives back a dead prefill's NIXL state, so that the prefill's GPU memory is free for its restart (issue 30).

Seen on the H200 (benchmarks/HISTORY.md, "Role deaths under load (chaos), H200"): a decode that READ prefill's KV
cache over cuda_ipc kept prefill's memory mapped after prefill was SIGKILLed, and vLLM refused the restarted prefill
(17.98 of 139.8 GiB free). NIXL alone (benchmarks/nixl_dead_peer.py) showed what gives the memory back: with
UCX_CUDA_IPC_CACHE=n (launch sets it on decode engines on CUDA, core/common/ucx.py), removing the remote agent. vLLM
removes a remote engine's agents only when it evicts an engine idle past `engine_ttl` (3600 s, looked at when a new
handshake starts; 0.26 and 0.32) or, in 0.32, once another engine answered at the same address: neither happens while
the dead prefill's memory keeps its successor from starting.

On when HYBRIDSERVE_RELEASE_DEAD_PEERS=1 (launch sets it on decode engines), on NixlPullConnectorWorker:
- `start_load_kv` notes each remote engine's side channel (host, port) from the requests it is given to read;
- a daemon thread connects to each noted side channel of an engine the worker holds agents for, every PROBE_S.
  REFUSALS refused connects in a row (nothing listens there: the process is gone; a busy or hung engine still
  accepts) mark the engine dead; a timeout or an unreachable host marks nothing (a partition may heal);
- a dead engine is released with vLLM's own `_cleanup_remote_engine` (prepared descriptor lists, remote agents,
  per-engine maps) once no request of this worker still reads from it (`_recving_metadata`) and no handshake is in
  flight (vLLM 0.32 defers its own cleanup the same way: a handshake loads NIXL metadata with the GIL released).

Thread safety: the release runs on the prober thread under one lock that the wrapped `start_load_kv` and per-step
result call (`get_finished` on 0.26, `get_transfer_results` on 0.32) hold too, and under vLLM's `_handshake_lock`
(which a handshake's completion takes): it never interleaves with the step thread's NIXL calls (the agent is built
without thread sync, see nixl_poll.py) or with a handshake landing. A later request naming the released engine
makes vLLM handshake again, which fails against a dead address (or a successor's different engine id) and fails
that request alone, as vLLM does for any unreachable peer.
"""

from __future__ import annotations

import enum
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from hybridserve.core.common import timeline_log
from hybridserve.core.common.contracts import RELEASED_EVENT, RELEASED_LOG_PREFIX
from hybridserve.core.vllm_plugin.import_hooks import after_import
from hybridserve.core.vllm_plugin.log import logger
from hybridserve.core.vllm_plugin.nixl_results import results_method

PULL_WORKER_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_worker"
PROBE_S = 1.0  # seconds between two probes of one side channel
CONNECT_TIMEOUT_S = 0.5
REFUSALS = 2  # refused connects in a row that make an engine dead (one could be a listener's restart race)


class Probe(enum.Enum):
    UP = "up"  # something accepted the connection
    REFUSED = "refused"  # nothing listens at the address: the engine's process is gone
    UNKNOWN = "unknown"  # timeout, no route: says nothing about the engine


def probe(host: str, port: int, timeout_s: float = CONNECT_TIMEOUT_S) -> Probe:
    """One TCP connect to a side channel, closed at once (vLLM's ZMQ listener drops a peer that sends nothing)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return Probe.UP
    except ConnectionRefusedError:
        return Probe.REFUSED
    except OSError:
        return Probe.UNKNOWN


@dataclass
class PeerWatch:
    """Which remote engines are dead, from their side channels' probes (bookkeeping only, no I/O)."""

    refusals_to_dead: int = REFUSALS
    addresses: dict[str, tuple[str, int]] = field(default_factory=dict)  # engine id -> side channel
    refusals: dict[str, int] = field(default_factory=dict)  # engine id -> refused probes in a row

    def note(self, engine_id: str, host: str, port: int) -> None:
        self.addresses.setdefault(engine_id, (host, port))

    def observe(self, engine_id: str, result: Probe) -> bool:
        """Record one probe; True when the engine counts as dead now."""
        if result is Probe.UP:
            self.refusals.pop(engine_id, None)
        elif result is Probe.REFUSED:
            self.refusals[engine_id] = self.refusals.get(engine_id, 0) + 1
        return self.refusals.get(engine_id, 0) >= self.refusals_to_dead

    def forget(self, engine_id: str) -> None:
        self.addresses.pop(engine_id, None)
        self.refusals.pop(engine_id, None)


class Release(enum.Enum):
    RELEASED = "released"
    GONE = "gone"  # the worker holds no agent for it (never handshaken, or vLLM evicted it)
    HANDSHAKING = "handshaking"  # a handshake is in flight: wait, as vLLM 0.32's own cleanup does
    READING = "reading"  # a request of this worker still reads from it


def try_release(worker: Any, engine_id: str) -> Release:
    """vLLM's `_cleanup_remote_engine` for one engine, when nothing of the worker still needs it."""
    with worker._handshake_lock:
        if engine_id not in worker._remote_agents:
            return Release.GONE
        if worker._handshake_futures:
            return Release.HANDSHAKING
        reading = {m.remote.engine_id for m in list(worker._recving_metadata.values()) if m.remote is not None}
        if engine_id in reading:
            return Release.READING
        worker._cleanup_remote_engine(engine_id, log_eviction=False)
    return Release.RELEASED


class Releaser:
    """One worker's prober thread and the lock its step calls share with the release."""

    def __init__(self, worker: Any, *, probe_s: float = PROBE_S,
                 probe_fn: Callable[[str, int], Probe] = probe) -> None:
        self.worker, self.probe_s, self.probe_fn = worker, probe_s, probe_fn
        self.step_lock = threading.RLock()
        self.watch = PeerWatch()
        self._stop = threading.Event()
        self.thread: threading.Thread | None = None

    def note(self, metadata: Any) -> None:
        """The side channels of the engines this step's requests read from (step thread)."""
        for meta in list(getattr(metadata, "reqs_to_recv", {}).values()):
            remote = getattr(meta, "remote", None)
            if remote is not None:
                self.watch.note(remote.engine_id, remote.host, int(remote.port))
        if self.thread is None and self.watch.addresses:
            self.thread = threading.Thread(target=self._run, name="hybridserve-peer-release", daemon=True)
            self.thread.start()

    def stop(self) -> None:
        self._stop.set()

    def run_once(self) -> list[str]:
        """Probe every noted engine the worker holds agents for; release the dead ones that can go. Returns them."""
        released = []
        for engine_id, (host, port) in list(self.watch.addresses.items()):
            if engine_id not in self.worker._remote_agents:
                continue  # not handshaken yet, or already gone: nothing of it is held
            if not self.watch.observe(engine_id, self.probe_fn(host, port)):
                continue
            with self.step_lock:
                outcome = try_release(self.worker, engine_id)
            if outcome is Release.RELEASED:
                refusals = self.watch.refusals.get(engine_id, 0)
                logger.info("%s %s at %s:%d (its side channel refused %d connects in a row)", RELEASED_LOG_PREFIX,
                            engine_id, host, port, refusals)
                timeline_log.emit(RELEASED_EVENT, "", engine=engine_id, address=f"{host}:{port}", refusals=refusals)
                released.append(engine_id)
            if outcome in (Release.RELEASED, Release.GONE):
                self.watch.forget(engine_id)
        return released

    def _run(self) -> None:
        while not self._stop.wait(self.probe_s):
            try:
                self.run_once()
            except Exception:  # noqa: BLE001 (a probe round must never take the engine down)
                logger.warning("hybridserve peer_release: a probe round failed", exc_info=True)


def releaser_of(worker: Any) -> Releaser:
    """The worker's releaser, made on first use (from the step thread)."""
    found = worker.__dict__.get("_hybridserve_releaser")
    if found is None:
        found = worker.__dict__["_hybridserve_releaser"] = Releaser(worker)
    return found


def patch_worker_module(module: ModuleType) -> None:
    worker_cls = module.NixlPullConnectorWorker
    name = results_method(worker_cls)
    start, results = worker_cls.start_load_kv, getattr(worker_cls, name)
    if getattr(start, "_hybridserve_release", False):
        return

    def start_load_kv(self: Any, metadata: Any, *args: Any, **kwargs: Any) -> Any:
        releaser = releaser_of(self)
        with releaser.step_lock:
            releaser.note(metadata)
            return start(self, metadata, *args, **kwargs)

    def step_results(self: Any, *args: Any, **kwargs: Any) -> Any:
        with releaser_of(self).step_lock:
            return results(self, *args, **kwargs)

    start_load_kv._hybridserve_release = True  # type: ignore[attr-defined]
    worker_cls.start_load_kv = start_load_kv
    setattr(worker_cls, name, step_results)


def install() -> None:
    after_import(PULL_WORKER_MODULE, patch_worker_module)
