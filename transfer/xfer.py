"""One request's READ: range check, prepare, post one transfer per prefill rank, poll to a deadline, release.

The decode side READs; each transfer carries a notification `<request id>:<decode TP>` (vLLM's format) that
reaches the prefill rank once its bytes have moved. Any failure raises TransferError naming the peer and the
phase, after every handle of the request is released (the caller then frees the request's blocks).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from hybridserve.transfer.agent import Agent
from hybridserve.transfer.dlist import ReadDescriptors
from hybridserve.transfer.errors import DescriptorRangeError, TransferError, TransferTimeout

Region = tuple[int, int]  # (address, bytes)


@dataclass(frozen=True, kw_only=True)
class ReadTiming:
    prepare_s: float  # prep_xfer_dlist on both sides + make_prepped_xfer
    post_s: float  # transfer() calls (with cma the copy happens inside)
    transfer_s: float  # first post to the last completion
    num_descriptors: int
    num_elements: int
    num_merged: int | None  # NIXL telemetry: descriptors after NIXL merged adjacent ones (None: not captured)
    num_bytes: int


def check_ranges(rows: np.ndarray, regions: list[Region], *, side: str, peer: str) -> None:
    """Refuse (before anything is prepared) an element not inside one registered region."""
    if not len(rows):
        return
    bases = np.array(sorted(a for a, _ in regions), dtype=np.uint64)
    ends = np.array([a + n for a, n in sorted(regions)], dtype=np.uint64)
    where = np.searchsorted(bases, rows[:, 0], side="right") - 1
    ok = where >= 0
    ok[ok] = rows[ok, 0] + rows[ok, 1] <= ends[where[ok]]
    if not ok.all():
        i = int(np.argmin(ok))
        raise DescriptorRangeError(f"{side} descriptor {i} for peer {peer!r} (address {int(rows[i, 0]):#x}, "
                                   f"{int(rows[i, 1])} bytes) is outside the {len(regions)} registered regions; "
                                   "refused before any byte moved")


def read_request(agent: Agent, peers: dict[int, str], reads: list[ReadDescriptors], *, mem: str, notif: bytes,
                 timeout_s: float, local_regions: list[Region] | None = None,
                 remote_regions: dict[int, list[Region]] | None = None,
                 on_post: Callable[[], None] | None = None, streams: int = 1) -> ReadTiming:
    """READ every ReadDescriptors from its prefill rank (`peers`: rank -> agent name) within `timeout_s`.

    `streams` > 1 splits each READ into that many transfers posted from as many threads; the notification then
    goes out once all of them are done (a per-transfer notification could tell the prefill side too early).
    """
    if local_regions is not None and remote_regions is not None:
        for read in reads:
            local, remote = read.expanded()
            check_ranges(local, local_regions, side="local", peer=peers[read.remote_rank])
            check_ranges(remote, remote_regions[read.remote_rank], side="remote", peer=peers[read.remote_rank])
    keys: list[int] = []
    handles: list[tuple[str, Any]] = []
    try:
        t0 = time.perf_counter()
        for read in reads:
            peer = peers[read.remote_rank]
            handles += [(peer, h) for h in _make(agent, peer, read, mem, notif if streams == 1 else b"", keys, streams)]
        t1 = time.perf_counter()
        if on_post is not None:  # lets a test act (kill the peer) while the transfer runs
            on_post()
        deadline = t1 + timeout_s
        if streams == 1:
            states = [_post(agent, peer, h, notif) for peer, h in handles]
            t2 = time.perf_counter()
            _wait(agent, handles, states, deadline=deadline, timeout_s=timeout_s)
        else:
            t2 = _parallel(agent, handles, deadline=deadline, timeout_s=timeout_s)
            for peer in dict.fromkeys(peers[r.remote_rank] for r in reads):  # after every chunk is DONE
                agent.nixl.send_notif(peer, notif)
        t3 = time.perf_counter()
        merged = _merged(agent, handles)
    finally:
        for _, h in handles:
            _release_quietly(h)
        for key in keys:
            agent.release(key)
    return ReadTiming(prepare_s=t1 - t0, post_s=t2 - t1, transfer_s=t3 - t1,
                      num_descriptors=sum(r.num_descriptors for r in reads),
                      num_elements=sum(r.num_elements for r in reads), num_merged=merged,
                      num_bytes=sum(r.num_bytes for r in reads))


def _parallel(agent: Agent, handles: list[tuple[str, Any]], *, deadline: float, timeout_s: float) -> float:
    """Post and complete each handle on its own thread (with cma the copy runs inside transfer(), GIL released)."""
    from concurrent.futures import ThreadPoolExecutor

    def one(item: tuple[str, Any]) -> None:
        state = _post(agent, item[0], item[1], b"")
        _wait(agent, [item], [state], deadline=deadline, timeout_s=timeout_s)

    with ThreadPoolExecutor(len(handles)) as pool:
        futures = [pool.submit(one, item) for item in handles]
        posted = time.perf_counter()
        for future in futures:
            future.result()
    return posted


def _make(agent: Agent, peer: str, read: ReadDescriptors, mem: str, notif: bytes, keys: list[int],
          streams: int) -> list[Any]:
    """Prepare both sides once; one transfer handle per stream, each over a contiguous share of the ids (vLLM's
    scheme: its whole registration-time lists prepared, the request's descriptor ids posted, as NixlConnector's
    `_read_blocks` does with make_prepped_xfer; NIXL merges dense runs of those ids)."""
    local, remote = read.for_prep()
    try:
        lh, key = agent.prep(None, local, mem)
        keys.append(key)
        rh, key = agent.prep(peer, remote, mem)
        keys.append(key)
        local_ids, remote_ids = read.indices()
        parts = min(streams, len(local_ids))
        return [agent.nixl.make_prepped_xfer("READ", lh, li, rh, ri, notif)
                for li, ri in zip(np.array_split(local_ids, parts), np.array_split(remote_ids, parts), strict=True)]
    except Exception as exc:
        raise TransferError(peer=peer, phase="prepare", detail=f"NIXL refused the descriptors "
                            f"({type(exc).__name__}: {exc}); no byte moved") from None


def _post(agent: Agent, peer: str, handle: Any, notif: bytes) -> str:
    try:
        return agent.nixl.transfer(handle, notif)
    except Exception as exc:
        raise TransferError(peer=peer, phase="transfer", detail=f"{type(exc).__name__}: {exc}") from None


def _wait(agent: Agent, handles: list[tuple[str, Any]], states: list[str], *, deadline: float,
          timeout_s: float) -> None:
    pending = [i for i, s in enumerate(states) if s != "DONE"]
    while pending:
        for i in list(pending):
            peer, handle = handles[i]
            try:
                state = agent.nixl.check_xfer_state(handle)
            except Exception as exc:
                raise TransferError(peer=peer, phase="transfer", detail=f"{type(exc).__name__}: {exc}") from None
            if state == "ERR":
                raise TransferError(peer=peer, phase="transfer", detail="NIXL reported ERR")
            if state == "DONE":
                pending.remove(i)
        if pending and time.perf_counter() > deadline:
            raise TransferTimeout(peer=handles[pending[0]][0], phase="transfer", timeout_s=timeout_s)


def _merged(agent: Agent, handles: list[tuple[str, Any]]) -> int | None:
    try:
        return sum(int(agent.nixl.get_xfer_telemetry(h).descCount) for _, h in handles)
    except Exception:  # telemetry not enabled on this agent
        return None


def _release_quietly(handle: Any) -> None:
    try:
        handle.release()
    except Exception:  # a transfer that died with its peer: NIXL may refuse to cancel; nothing else to do
        pass


def wait_notifications(agent: Agent, request_id: str, expected: int, *, timeout_s: float) -> list[str]:
    """Prefill side: wait for `expected` notifications of `request_id` (one per decode rank reading here)."""
    deadline = time.monotonic() + timeout_s
    senders: list[str] = []
    tag = request_id.encode()
    while len(senders) < expected:
        for sender, messages in agent.nixl.get_new_notifs().items():
            agent.inbox += [(str(sender), m) for m in messages]
        senders += [s for s, m in agent.inbox if m.split(b":")[0] == tag]
        agent.inbox = [(s, m) for s, m in agent.inbox if m.split(b":")[0] != tag]
        if len(senders) < expected:
            if time.monotonic() > deadline:
                raise TransferTimeout(peer="decode", phase="notify", timeout_s=timeout_s,
                                      detail=f"request {request_id}: {len(senders)} of {expected} notifications")
            time.sleep(0.001)
    return senders

