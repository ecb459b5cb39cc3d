"""Decode's view of each prefill lease it reads from: until when the blocks are surely still held (bookkeeping only).

Times are the worker's `time.perf_counter()`. A request's deadline starts from prefill's stamp (core/common/kv_lease.py:
the lease's end in Unix seconds, less the margin for clock skew) and moves later only with the heartbeats this worker
itself sent and saw go out:

- vLLM's decode scheduler tracks a request with `do_remote_prefill` from its arrival (`on_new_request`, 0.26 and
  0.32 nixl/base_scheduler.py) until its READ is done, and hands its worker the tracked ids every `lease // 6`
  seconds of scheduler steps (`build_connector_meta`); the worker sends "HB:<ids>" to every agent of the prefill
  engine (`_send_heartbeats`, once that engine's handshake is done);
- prefill, on taking a heartbeat, sets the lease of each id it still holds to max(its end, now + lease * 2 // 3)
  (`_handle_heartbeat`), and takes its notifications before it frees expired leases (`get_transfer_results` /
  `get_finished`: `_get_new_notifs` first, `_reap_expired_send_leases` after).

So a heartbeat whose sends to every agent began at t0 and returned by t1 < deadline (the margin covering its way to
prefill) moves the deadline to max(deadline, t0 + extension): prefill took it before freeing the blocks, at a time
after t0. A heartbeat that began too late proves nothing and moves nothing. One assumption is left: prefill holds the
request's lease (it registers it at its next engine step, `start_load_kv`) before a heartbeat sent more than
`lease - extension` (a third of the lease) after the request finished reaches it; a heartbeat taken earlier is
ignored by prefill, which is safe only while prefill's own lease still covers what it claimed.

A READ is posted only before the deadline, and accepted only when its completion was seen before it; anything else
is refused and the request's prompt computed again (lease_guard.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

Round = tuple[float, float]  # (t0: first send began, t1: last send returned) of one heartbeat to every agent


def extended(deadline: float, rounds: list[Round], extension_s: float) -> float:
    """The deadline after `rounds` (in the order they were sent): each one sent in time moves it to t0 + extension."""
    for t0, t1 in rounds:
        if t1 < deadline:
            deadline = max(deadline, t0 + extension_s)
    return deadline


@dataclass
class Lease:
    engine_id: str
    remote_id: str
    deadline: float


@dataclass
class LeaseBook:
    """One decode worker's leases (by its request id) and the heartbeats sent for requests it has not read yet."""

    extension_s: float  # vLLM's `_lease_extension`: lease * 2 // 3
    leases: dict[str, Lease] = field(default_factory=dict)
    rounds: dict[tuple[str, str], list[Round]] = field(default_factory=dict)  # (engine, remote id) -> heartbeats

    def track(self, req_id: str, engine_id: str, remote_id: str, first_deadline: float) -> float:
        """Start guarding a request whose READ is about to be posted; its deadline from the stamp and the heartbeats
        sent for it while it waited."""
        deadline = extended(first_deadline, self.rounds.get((engine_id, remote_id), []), self.extension_s)
        self.leases[req_id] = Lease(engine_id=engine_id, remote_id=remote_id, deadline=deadline)
        return deadline

    def heartbeat(self, engine_id: str, remote_ids: set[str] | frozenset[str], t0: float, t1: float) -> None:
        """A heartbeat went to every agent of `engine_id`; ids the scheduler no longer lists are forgotten."""
        for key in [k for k in self.rounds if k[0] == engine_id and k[1] not in remote_ids]:
            del self.rounds[key]
        for remote_id in remote_ids:  # kept one per quarter extension: dropping a round only moves less (safe)
            kept = self.rounds.setdefault((engine_id, remote_id), [])
            if not kept or t0 - kept[-1][0] >= self.extension_s / 4:
                kept.append((t0, t1))
        for lease in self.leases.values():
            if lease.engine_id == engine_id and lease.remote_id in remote_ids:
                lease.deadline = extended(lease.deadline, [(t0, t1)], self.extension_s)

    def heard(self, engine_id: str, remote_id: str, now: float) -> str:
        """What the book holds of a request's heartbeats, for a refusal's log line."""
        kept = self.rounds.get((engine_id, remote_id), [])
        if not kept:
            return "no heartbeat kept for it"
        return (f"{len(kept)} heartbeat(s) kept for it, the first {now - kept[0][0]:.2f} s and the last "
                f"{now - kept[-1][0]:.2f} s before")

    def deadline(self, req_id: str) -> float | None:
        lease = self.leases.get(req_id)
        return None if lease is None else lease.deadline

    def finish(self, req_id: str) -> None:
        lease = self.leases.pop(req_id, None)
        if lease is not None:
            self.rounds.pop((lease.engine_id, lease.remote_id), None)


@dataclass(frozen=True)
class RefusedLoads:
    """Requests whose READ a worker refused this step, for the scheduler (vLLM's KVConnectorWorkerMetadata protocol:
    the outputs of all workers are merged with `aggregate`, 0.26 and 0.32 kv_connector/utils.py)."""

    req_ids: frozenset[str]

    def aggregate(self, other: object) -> RefusedLoads:
        return RefusedLoads(self.req_ids | getattr(other, "req_ids", frozenset()))
