"""Decode-side NIXL READ completion seen when it happens, not one engine step later (issue 21 point 4).

Off unless HYBRIDSERVE_NIXL_POLL=1 (then vLLM's method objects are untouched and nothing costs). Why: NIXL stamps a
transfer's end (`xferDuration` telemetry, vLLM's `vllm:nixl_xfer_time_seconds`) in `getXferStatus`, at the first
`check_xfer_state` that returns DONE, and vLLM polls that once per engine step (`get_finished` /
`get_transfer_results` -> `_pop_done_transfers`), right after the forward is launched (CUDA is async), so a READ
that lands during the forward is seen one step later. Two parts, both on NixlPullConnectorWorker (decode):

- poller: a daemon thread that, while the worker's `_recving_transfers` holds handles, calls the agent's
  `check_xfer_state` on each every HYBRIDSERVE_NIXL_POLL_US (default 500) microseconds, so NIXL stamps the true
  end, and keeps the handles it saw DONE or ERR in `done` (a lock-guarded set). With nothing in flight it sleeps
  on an Event (woken by `start_load_kv`), no spinning core.
- late poll: before vLLM's per-step poll, when READs are in flight (and the poller has not already seen all of
  them end) and the worker's device is CUDA, wait for the current stream (the step's forward) so completions
  during the forward are reported this step. CPU: nothing.

Thread safety: vLLM builds its agent with `nixl_agent_config(num_threads=..., capture_telemetry=True)`
(nixl/base_worker.py), so no listener thread, and nixl 1.5.1's `nixl_agent.__init__` then picks
`NIXL_THREAD_SYNC_NONE` (nixl/_api.py: `default_sync_mode = STRICT if enable_listen else NONE`), whose nixlLock
does nothing (src/core/sync.h); `getXferStatus` mutates the request's status and telemetry and `releaseXferReq`
frees it (src/core/nixl_agent.cpp). So the agent is not safe from a second thread: the worker's `nixl_wrapper` is
replaced by `LockedAgent`, which holds one lock around every agent call the worker makes, and the poller calls
the agent under the same lock and skips a handle already released (nixl_xfer_handle._released).

A vLLM without the names used here: one warning, everything stays off, serving untouched.
"""

from __future__ import annotations

import os
import threading
import time
from types import ModuleType
from typing import Any

from hybridserve.core.vllm_plugin.import_hooks import after_import
from hybridserve.core.vllm_plugin.log import logger
from hybridserve.core.vllm_plugin.nixl_results import results_method

POLL = "HYBRIDSERVE_NIXL_POLL"
POLL_US = "HYBRIDSERVE_NIXL_POLL_US"
DEFAULT_POLL_US = 500
PULL_WORKER_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_worker"
WORKER_METHODS = ("__init__", "start_load_kv", "_pop_done_transfers")
TRANSFERS = "_recving_transfers"  # vLLM 0.26 and 0.32: req_id -> list of READ handles in flight


def poll_us_from_env(env: dict[str, str] | None = None) -> int | None:
    """The poll interval when the switch is on, else None."""
    env = os.environ if env is None else env
    if env.get(POLL, "").strip() != "1":
        return None
    text = env.get(POLL_US, "").strip()
    try:
        value = int(text) if text else DEFAULT_POLL_US
    except ValueError:
        value = -1
    if value <= 0:
        logger.warning("hybridserve nixl_poll: %s=%r is not a positive integer; using %d", POLL_US, text,
                       DEFAULT_POLL_US)
        value = DEFAULT_POLL_US
    return value


class LockedAgent:
    """The worker's nixl agent with one lock held around each of its method calls (attributes pass through)."""

    def __init__(self, inner: Any, lock: threading.RLock) -> None:
        self._inner, self._lock = inner, lock

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._inner, name)
        if not callable(value):
            return value
        lock = self._lock

        def locked(*args: Any, **kwargs: Any) -> Any:
            with lock:
                return value(*args, **kwargs)

        return locked


def _in_flight(transfers: Any) -> list[Any]:
    """The handles in flight now (a copy: the step thread changes the dict while this runs)."""
    for _ in range(3):
        try:
            return [h for handles in list(transfers.values()) for h in list(handles)]
        except RuntimeError:  # changed size during the copy
            continue
    return []


class Poller:
    """The background completion poller of one worker."""

    def __init__(self, agent: Any, transfers: Any, lock: threading.RLock, interval_s: float) -> None:
        self._agent, self._transfers, self._lock, self._interval_s = agent, transfers, lock, interval_s
        self._wake, self._stop = threading.Event(), threading.Event()
        self._done: set[Any] = set()  # handles seen DONE or ERR, still in flight at vLLM
        self._done_lock = threading.Lock()
        self.num_checks = 0
        self.thread = threading.Thread(target=self._run, name="hybridserve-nixl-poll", daemon=True)

    def start(self) -> Poller:
        self.thread.start()
        return self

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def is_done(self, handle: Any) -> bool:
        with self._done_lock:
            return handle in self._done

    def all_done(self, handles: list[Any]) -> bool:
        with self._done_lock:
            return all(h in self._done for h in handles)

    def poll_once(self) -> int:
        """Check every in-flight handle not yet seen ended; returns how many are in flight."""
        handles = _in_flight(self._transfers)
        with self._done_lock:
            self._done.intersection_update(handles)  # drop what vLLM has popped (keeps no handle alive)
            pending = [h for h in handles if h not in self._done]
        for handle in pending:
            with self._lock:
                if getattr(handle, "_released", False):  # released by the step thread since the copy
                    continue
                try:
                    state = self._agent.check_xfer_state(handle)
                except Exception:  # vLLM's own poll meets and reports the same error
                    state = "ERR"
                self.num_checks += 1
            if state != "PROC":
                with self._done_lock:
                    self._done.add(handle)
        return len(handles)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                num = self.poll_once()
            except Exception as e:  # never let the poller die silently and never touch serving
                logger.warning("hybridserve nixl_poll: poller stopped: %s", e)
                return
            if num:
                time.sleep(self._interval_s)
                continue
            self._wake.clear()
            if not _in_flight(self._transfers):  # a READ posted between the poll and the clear
                self._wake.wait()


def _is_cuda(worker: Any) -> bool:
    if getattr(worker, "device_type", None) != "cuda":
        return False
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def patch_pull_worker(module: ModuleType, interval_s: float) -> bool:
    """Patch NixlPullConnectorWorker; False (one warning, nothing patched) when a name is missing."""
    cls = getattr(module, "NixlPullConnectorWorker", None)
    if cls is None:
        logger.warning("hybridserve nixl_poll: %s has no NixlPullConnectorWorker; poll stays off", module.__name__)
        return False
    if getattr(cls, "_hybridserve_nixl_poll", False):
        return True
    results = results_method(cls)
    absent = [n for n in (*WORKER_METHODS, results) if not callable(getattr(cls, n, None))]
    if absent:
        logger.warning("hybridserve nixl_poll: %s has no %s; poll stays off", cls.__name__, ", ".join(absent))
        return False
    init, start_load, poll = cls.__init__, cls.start_load_kv, getattr(cls, results)

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        agent, transfers = getattr(self, "nixl_wrapper", None), getattr(self, TRANSFERS, None)
        if agent is None or not hasattr(agent, "check_xfer_state") or not hasattr(transfers, "values"):
            logger.warning("hybridserve nixl_poll: the worker has no nixl_wrapper.check_xfer_state or %s; "
                           "poll stays off", TRANSFERS)
            return
        lock = threading.RLock()
        self.nixl_wrapper = LockedAgent(agent, lock)
        self._hybridserve_poller = Poller(agent, transfers, lock, interval_s).start()
        logger.info("hybridserve nixl_poll: completion poller every %.0f us, late poll %s", interval_s * 1e6,
                    "on (CUDA)" if _is_cuda(self) else "off (not CUDA)")

    def start_load_kv(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return start_load(self, *args, **kwargs)
        finally:
            poller = self.__dict__.get("_hybridserve_poller")
            if poller is not None and getattr(self, TRANSFERS, None):
                poller.wake()

    def late_poll(self: Any, *args: Any, **kwargs: Any) -> Any:
        poller = self.__dict__.get("_hybridserve_poller")
        if poller is not None:
            handles = _in_flight(getattr(self, TRANSFERS, {}))
            if handles and not poller.all_done(handles) and _is_cuda(self):
                import torch

                torch.cuda.current_stream().synchronize()  # the step's forward: READs landing in it count now
        return poll(self, *args, **kwargs)

    late_poll.__name__ = results
    cls.__init__, cls.start_load_kv = __init__, start_load_kv
    setattr(cls, results, late_poll)
    cls._hybridserve_nixl_poll = True
    return True


def install(interval_us: int) -> None:
    after_import(PULL_WORKER_MODULE, lambda module: patch_pull_worker(module, interval_us / 1e6))
