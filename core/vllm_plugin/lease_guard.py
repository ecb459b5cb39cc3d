"""Decode never answers from prefill blocks that may have been freed or reused: the worker side (issue 39).

On NixlPullConnectorWorker (vLLM 0.26 and 0.32), when HYBRIDSERVE_LEASE_GUARD=1 (launch sets it on every engine):
- `__init__`: the worker's NIXL agent is wrapped so that each heartbeat send is timed (`HeartbeatRecorder`);
- `_send_heartbeats`: a heartbeat that went to every agent of a prefill engine moves the deadlines of the requests it
  names (lease_book.py says when that is proven);
- `_read_blocks_for_req`: a request whose READ would begin at or past its deadline is not read: vLLM's own
  bookkeeping reports it done at once (an empty list of transfers, as vLLM seeds for a rank with nothing to read);
- `_pop_done_transfers`: a READ whose completion is first seen past the deadline is refused too (the blocks may
  have been reused while it ran);
- `_handle_failed_transfer`, vLLM 0.26 only: a failed receive of a hybrid model is refused too. 0.26 reports it as
  received and marks no block invalid for a hybrid model ("TODO handle failed transfer for HMA"), so the scheduler
  answers from whatever the blocks hold (vllm#52234); 0.32 reports it in `failed_recving` and applies
  kv_load_failure_policy, which is left alone;
- `NixlBaseConnector.build_connector_worker_meta`: the refused requests of the step go to the scheduler
  (`RefusedLoads`), which computes their prompts again (lease_stamp.py).
Each refusal is one warning line (`REFUSED_LOG_PREFIX`); a lease refusal counts in vLLM's
`vllm:nixl_num_kv_expired_reqs`.
A request whose kv_transfer_params carry no stamp (a prefill without the plugin) is read as vLLM reads it. A READ is
refused before it is posted only once the prefill engine's handshake is done: vLLM's bookkeeping of a finished
receive looks the engine up.
"""

from __future__ import annotations

import threading
import time
from types import ModuleType
from typing import Any

from hybridserve.core.common.contracts import REFUSED_LOG_PREFIX
from hybridserve.core.common.kv_lease import margin_from_env
from hybridserve.core.vllm_plugin.import_hooks import after_import
from hybridserve.core.vllm_plugin.lease_book import LeaseBook, RefusedLoads
from hybridserve.core.vllm_plugin.log import logger

PULL_WORKER_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_worker"
CONNECTOR_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector"
STAMP_ATTR = "_hybridserve_lease_end"  # set on a ReqMeta by lease_stamp.py: prefill's stamp (Unix seconds)
BOOK, REFUSED, RECORDER, MARGIN = "_hs_lease_book", "_hs_lease_refused", "_hs_hb_recorder", "_hs_lease_margin"
LOCK = "_hs_lease_lock"  # around REFUSED: 0.26 reports a failed handshake from its handshake thread


class HeartbeatRecorder:
    """The worker's NIXL agent, passed through, with the time span of every successful heartbeat send noted."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.sent: list[tuple[str, float, float]] = []  # (agent name, began, returned)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def send_notif(self, agent_name: str, *args: Any, **kwargs: Any) -> Any:
        message = kwargs.get("notif_msg", args[0] if args else b"")
        began = time.perf_counter()
        out = self._inner.send_notif(agent_name, *args, **kwargs)
        if isinstance(message, bytes) and message.startswith(b"HB:"):
            self.sent.append((agent_name, began, time.perf_counter()))
        return out


def _refuse(worker: Any, req_id: str, why: str, *, is_expired: bool = True) -> None:
    with worker.__dict__[LOCK]:
        worker.__dict__[REFUSED].add(req_id)
    stats = getattr(worker, "xfer_stats", None)
    if is_expired and stats is not None and hasattr(stats, "record_kv_expired_req"):
        stats.record_kv_expired_req()
    logger.warning("%s %s: %s; its prompt is computed here instead", REFUSED_LOG_PREFIX, req_id, why)


def _first_deadline(worker: Any, meta: Any) -> float | None:
    """The stamp in the worker's clock, less the margin; None without a stamp."""
    end = getattr(meta, STAMP_ATTR, None)
    if not isinstance(end, (int, float)):
        return None
    return time.perf_counter() + (end - time.time()) - worker.__dict__[MARGIN]


def _awaits_data(worker: Any, req_id: str, meta: Any) -> bool:
    """The scheduler waits for this READ and it moves blocks (not a notify-only cleanup or a full local hit)."""
    blocks = getattr(meta, "local_block_ids", None) or ()
    return req_id in getattr(worker, "_recving_metadata", {}) and any(len(group) > 0 for group in blocks)


def patch_worker(cls: Any) -> None:
    init, read, pop, beat = cls.__init__, cls._read_blocks_for_req, cls._pop_done_transfers, cls._send_heartbeats

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807
        init(self, *args, **kwargs)
        recorder = HeartbeatRecorder(self.nixl_wrapper)
        self.nixl_wrapper = recorder
        self.__dict__.update({BOOK: LeaseBook(extension_s=float(self._lease_extension)), REFUSED: set(),
                              RECORDER: recorder, MARGIN: margin_from_env(), LOCK: threading.Lock()})
        logger.info("hybridserve lease guard: on (heartbeat extension %s s, margin %s s)", self._lease_extension,
                    self.__dict__[MARGIN])

    def _read_blocks_for_req(self: Any, req_id: str, meta: Any) -> Any:
        book = self.__dict__.get(BOOK)
        remote = getattr(meta, "remote", None)
        if (book is None or remote is None or not _awaits_data(self, req_id, meta)
                or remote.engine_id not in self._remote_agents):  # 0.32: the original starts the handshake
            return read(self, req_id, meta)
        deadline = book.deadline(req_id)
        if deadline is None:
            first = _first_deadline(self, meta)
            if first is None:
                return read(self, req_id, meta)
            deadline = book.track(req_id, remote.engine_id, remote.request_id, first)
        now = time.perf_counter()
        late = now - deadline
        if late >= 0:
            _refuse(self, req_id, f"its lease ran out {late:.2f} s before the READ would begin "
                    f"({book.heard(remote.engine_id, remote.request_id, now)})")
            self._recving_transfers.setdefault(req_id, [])  # reported done at the next poll, nothing read
            return None
        return read(self, req_id, meta)

    def _pop_done_transfers(self: Any, transfers: Any) -> Any:
        out = pop(self, transfers)
        book = self.__dict__.get(BOOK)
        if book is None:
            return out
        seen = time.perf_counter()
        done, failed = (out if isinstance(out, tuple) else (out, set()))  # 0.32: (done, failed); 0.26: done
        for req_id in done:
            deadline = book.deadline(req_id)
            if deadline is None:
                continue
            book.finish(req_id)
            if req_id not in refused(self) and req_id not in failed and seen > deadline:
                _refuse(self, req_id, f"its READ was seen complete {seen - deadline:.2f} s past its lease")
        return out

    def _send_heartbeats(self: Any, metadata: Any) -> Any:
        recorder, book = self.__dict__.get(RECORDER), self.__dict__.get(BOOK)
        if recorder is None or book is None:
            return beat(self, metadata)
        recorder.sent.clear()
        out = beat(self, metadata)
        for engine_id, info in (getattr(metadata, "heartbeat_by_engine", None) or {}).items():
            agents = set((self._remote_agents.get(engine_id) or {}).values())
            spans = [(began, back) for name, began, back in recorder.sent if name in agents]
            if agents and {name for name, _, _ in recorder.sent if name in agents} == agents:
                book.heartbeat(engine_id, frozenset(info.req_ids), min(b for b, _ in spans), max(r for _, r in spans))
        recorder.sent.clear()
        return out

    cls.__init__, cls._read_blocks_for_req = __init__, _read_blocks_for_req
    cls._pop_done_transfers, cls._send_heartbeats = _pop_done_transfers, _send_heartbeats
    if not hasattr(cls, "get_transfer_results"):  # vLLM 0.26 (nixl_results.py)
        patch_failed_receive(cls)
    cls._hybridserve_lease_guard = True


def refused(worker: Any) -> set[str]:
    with worker.__dict__[LOCK]:
        return set(worker.__dict__[REFUSED])


def take_refused(worker: Any) -> frozenset[str]:
    """The worker's refusals since the last call (emptied)."""
    lock = getattr(worker, "__dict__", {}).get(LOCK)
    if lock is None:
        return frozenset()
    with lock:
        found = frozenset(worker.__dict__[REFUSED])
        worker.__dict__[REFUSED].clear()
    return found


def patch_failed_receive(cls: Any) -> None:
    failed = cls._handle_failed_transfer

    def _handle_failed_transfer(self: Any, req_id: str, *args: Any, **kwargs: Any) -> Any:
        out = failed(self, req_id, *args, **kwargs)
        if self.__dict__.get(BOOK) is not None and getattr(self, "_is_hma_required", False):
            _refuse(self, req_id, "its receive failed (vLLM 0.26 would answer from the blocks as they are)",
                    is_expired=False)  # vLLM counted it as a failed transfer
        return out

    cls._handle_failed_transfer = _handle_failed_transfer


def patch_connector(cls: Any) -> None:
    build = cls.build_connector_worker_meta

    def build_connector_worker_meta(self: Any) -> Any:
        out = build(self)
        if out is not None:  # never so for vLLM's NixlConnector (0.26, 0.32: the base's None); refusals wait
            return out
        found = take_refused(getattr(self, "connector_worker", None))
        return RefusedLoads(found) if found else None

    cls.build_connector_worker_meta = build_connector_worker_meta
    cls._hybridserve_lease_guard = True


def install() -> None:
    def worker_module(module: ModuleType) -> None:
        if not getattr(module.NixlPullConnectorWorker, "_hybridserve_lease_guard", False):
            patch_worker(module.NixlPullConnectorWorker)

    def connector_module(module: ModuleType) -> None:
        if not getattr(module.NixlBaseConnector, "_hybridserve_lease_guard", False):
            patch_connector(module.NixlBaseConnector)

    after_import(PULL_WORKER_MODULE, worker_module)
    after_import(CONNECTOR_MODULE, connector_module)
