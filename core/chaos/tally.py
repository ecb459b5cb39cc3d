"""The chaos bench's counts, from what was recorded (client records, the proxy's timeline, launch's restart
events, KV samples), never from logs: one row per kill, and whether the row meets the goals.

A request belongs to the last kill before it ended (requests that ended before the first kill: the row "before").
- retried / fell back: the request's timeline holds a `retry` / `fallback` event (core/proxy/failover.py);
- failed: not a whole answer; `unexcused`: failed although it had not begun streaming when its role died (a stream
  whose first event came before the kill may end with the error event). A request in flight through a proxy that was
  killed is lost with it (`lost`: nothing behind the front door can answer it); one refused while the proxy is down
  is counted apart (`refused`);
- first ok s: from the kill to the end of the first request sent after it that succeeded (whichever row it is in);
- restart s: from the kill to launch's `serving` event of the last role killed (role_watch.py);
- judged / wrong: each OK answer is compared with one server's greedy answer to its prompt (prefill's own, asked
  once per prompt of the pool: run.py) under validate's rules (core/validate/judge.py); `wrong` is an OK answer that
  is not that answer (HTTP 200 with another answer: the worst outcome, issue 39);
- goals: no unexcused failure; no wrong answer; a decode killed while another is alive: no failure but begun
  streams and no fallback; first ok within restart + RECOVERY_SLACK_S.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hybridserve.core.chaos.bounded_load import Sent
from hybridserve.core.deployments.client import Completion
from hybridserve.core.validate.judge import wrong_reason
from hybridserve.core.validate.thresholds import Thresholds

RECOVERY_SLACK_S = 5.0


@dataclass(frozen=True, kw_only=True)
class Kill:
    t: float  # time.time() of the SIGKILL
    roles: tuple[str, ...]  # what was killed: "decode-0", "prefill-0", "proxy"
    alive_decodes: tuple[str, ...]  # decode instances still up at that moment
    phase: int = 1  # the bench's phase (a phase may kill several roles in turn)

    @property
    def label(self) -> str:
        return f"{self.phase} {'+'.join(self.roles)}"

    @property
    def is_decode(self) -> bool:
        return any(role.startswith("decode") for role in self.roles)


@dataclass(frozen=True, kw_only=True)
class KillRow:
    kill: str
    alive_decodes: str
    sent: int
    ok: int
    retried: int
    fell_back: int
    failed: int
    unexcused: int
    lost: int
    refused: int
    judged: int  # OK answers compared with the reference (an answer without logprobs cannot be)
    wrong: int  # OK answers that are not the reference's answer
    first_ok_s: float | None
    restart_s: float | None
    goals_met: tuple[str, ...]  # the goals this row checks, each "name: yes" or "name: NO"

    @property
    def is_met(self) -> bool:
        return all(goal.endswith(": yes") for goal in self.goals_met)


def failover_ids(timeline: Sequence[dict]) -> tuple[set[str], set[str]]:
    """(request ids with a retry, request ids with a fallback) from the timeline's proxy events."""
    retried = {e["req"] for e in timeline if e.get("event") == "retry"}
    fell = {e["req"] for e in timeline if e.get("event") == "fallback"}
    return retried, fell


def restart_seconds(kill: Kill, restarts: Sequence[dict]) -> float | None:
    """Kill -> the `serving` event (after the kill) of its last role back; None when one never came back."""
    backs = []
    for role in kill.roles:
        times = [e["t"] for e in restarts if e["role"] == role and e["event"] == "serving" and e["t"] > kill.t]
        if not times:
            return None
        backs.append(min(times))
    return round(max(backs) - kill.t, 2)


def verdicts(sent: Sequence[Sent], references: Sequence[Completion], thresholds: Thresholds) -> dict[str, str | None]:
    """Request id -> why its OK answer is wrong (None: right), for every OK answer that came with logprobs."""
    return {s.rid: wrong_reason(references[s.prompt_index], s.answer, thresholds) for s in sent
            if s.is_ok and s.answer is not None and s.prompt_index < len(references)}


def tally(sent: Sequence[Sent], kills: Sequence[Kill], timeline: Sequence[dict], restarts: Sequence[dict],
          judged: dict[str, str | None] | None = None) -> list[KillRow]:
    retried, fell = failover_ids(timeline)
    judged = judged or {}
    order = sorted(kills, key=lambda k: k.t)
    rows = [_row(None, [s for s in sent if not order or s.end < order[0].t], sent, retried, fell, restarts, judged)]
    for i, kill in enumerate(order):
        until = order[i + 1].t if i + 1 < len(order) else float("inf")
        rows.append(_row(kill, [s for s in sent if kill.t <= s.end < until], sent, retried, fell, restarts, judged))
    return rows


def _row(kill: Kill | None, mine: list[Sent], sent: Sequence[Sent], retried: set[str], fell: set[str],
         restarts: Sequence[dict], judged: dict[str, str | None]) -> KillRow:
    proxy_killed = kill is not None and "proxy" in kill.roles
    lost = [s for s in mine if proxy_killed and not s.is_ok and not s.is_refused and s.error_role == "proxy"
            and s.start < kill.t]
    refused = [s for s in mine if s.is_refused]
    failed = [s for s in mine if not s.is_ok and s not in refused]
    begun = [s for s in failed if kill is not None and s.first_byte is not None and s.first_byte < kill.t]
    unexcused = [s for s in failed if s not in begun and s not in lost]
    after = [s.end - kill.t for s in sent if kill is not None and s.is_ok and s.start >= kill.t]  # any row's
    first_ok = round(min(after), 2) if after else None
    restart = restart_seconds(kill, restarts) if kill is not None else None
    wrong = [s for s in mine if judged.get(s.rid) is not None]
    goals = [f"no unexcused failure: {'yes' if not unexcused else 'NO'}",
             f"no wrong answer: {'yes' if not wrong else 'NO'}"]
    if kill is not None and kill.is_decode and kill.alive_decodes:
        clean = not [s for s in failed if s not in begun] and not any(s.rid in fell for s in mine)
        goals.append(f"all served with a decode alive: {'yes' if clean else 'NO'}")
    if kill is not None:
        in_time = first_ok is not None and restart is not None and first_ok <= restart + RECOVERY_SLACK_S
        goals.append(f"first ok within restart + {RECOVERY_SLACK_S:.0f} s: {'yes' if in_time else 'NO'}")
    return KillRow(kill=kill.label if kill else "before", alive_decodes=", ".join(kill.alive_decodes) or "none"
                   if kill else "all", sent=len(mine), ok=sum(s.is_ok for s in mine),
                   retried=sum(s.rid in retried for s in mine), fell_back=sum(s.rid in fell for s in mine),
                   failed=len(failed), unexcused=len(unexcused), lost=len(lost), refused=len(refused),
                   judged=sum(s.rid in judged for s in mine), wrong=len(wrong), first_ok_s=first_ok, restart_s=restart,
                   goals_met=tuple(goals))


def held_seconds(samples: Sequence[tuple[float, str, float | None]], name: str, since: float,
                 idle: float = 0.0) -> float | None:
    """Seconds from `since` until `name`'s KV usage was back at `idle` and stayed there; None when it never was."""
    mine = [(t, v) for t, n, v in samples if n == name and t >= since and v is not None]
    back = None
    for t, value in mine:
        if value <= idle:
            back = back if back is not None else t
        else:
            back = None
    return round(back - since, 2) if back is not None else None


def released_seconds(kills: Sequence[Kill], timeline: Sequence[dict], event: str) -> dict[str, list[float]]:
    """Per kill: the seconds from it to each `event` (a decode gave back a dead engine's NIXL state,
    core/vllm_plugin/peer_release.py) before the next kill. Only a prefill's death should have any."""
    out: dict[str, list[float]] = {}
    for i, kill in enumerate(kills):
        until = kills[i + 1].t if i + 1 < len(kills) else float("inf")
        out[kill.label] = sorted(round(e["t"] - kill.t, 2) for e in timeline
                                 if e.get("event") == event and kill.t <= e["t"] < until)
    return out
