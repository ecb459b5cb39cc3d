"""Serving with `--restart on-failure`: watch every role, restart the one that fails, keep the others serving.

Each role is SERVING, WAITING (its backoff), STARTING (started again, not yet healthy) or WARMING (healthy again,
its warm-up burst under way: warming.py; the proxy keeps client requests off it meanwhile). A SERVING role fails when
it exits (any code) or misses `unhealthy_checks` health checks in a row: an engine must answer /health with 200 (vLLM
answers 503 once its engine core is dead); the proxy role only has to answer at all (vllm-router answers 503 while a
worker is out, and taking workers out is the router's own business). A failed role's process group is SIGKILLed at
once (the ports must be free for its restart) and the ledger (restart.py) gives its backoff or spends the cap. Every
transition is an event: one JSON line in `<run folder>/restarts.jsonl` (what the chaos bench reads) and one message.
Engines that share a GPU start (and warm up) one at a time, as at launch (vLLM sizes its KV cache from the memory
free then).
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from hybridserve.core.common.contracts import RESTART_LOG
from hybridserve.core.common.errors import HybridserveError
from hybridserve.core.supervise.guard import wait_groups_gone
from hybridserve.core.supervise.health import SLOW, health_answer, health_status
from hybridserve.core.supervise.process import RunningRole
from hybridserve.core.supervise.restart import RestartLedger, RestartLimits, cap_text
from hybridserve.core.supervise.start_failure import start_failure



class RestartCapSpentError(HybridserveError):
    """A role failed more often than the restart cap allows; every role has been stopped (exit 1)."""

    exit_code = 1


class Phase(enum.Enum):
    SERVING = "serving"
    WAITING = "waiting"
    STARTING = "starting"
    WARMING = "warming"


@dataclass
class Watched:
    role: RunningRole
    ledger: RestartLedger
    phase: Phase = Phase.SERVING
    until: float = 0.0  # WAITING: when to start again; STARTING: the deadline for /health
    missed_checks: int = 0
    slow_checks: int = 0  # checks in a row the server took but did not answer in time
    down_since: float = 0.0
    last_status: int | None = field(default=None)
    warm_up: Future | None = None  # WARMING: the burst's seconds (warming.Warmer.warm), or its error


def is_alive(role: RunningRole, status: int | None) -> bool:
    return status == 200 if role.command.role.is_engine else status is not None


class RoleWatch:
    """`roles`: runner.StartedRoles (start_again); `on_message`: one line per event, for the operator."""

    def __init__(self, roles, *, limits: RestartLimits, start_timeout_s: float,  # noqa: ANN001
                 on_message: Callable[[str], None] | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.roles, self.limits, self.start_timeout_s, self.clock = roles, limits, start_timeout_s, clock
        self.on_message = on_message or (lambda _line: None)
        self.watched = [Watched(role, RestartLedger(limits)) for role in roles]
        self.log_path = Path(roles.run_dir) / RESTART_LOG
        self.next_check = 0.0
        self.checks = ThreadPoolExecutor(max_workers=max(1, len(self.watched)), thread_name_prefix="health")
        self.pending: dict[str, Future] = {}
        self.warmer = getattr(roles, "warmer", None)  # runner.started's; None: no warm-ups (tests' bare roles)
        self.warm_ups = ThreadPoolExecutor(max_workers=max(1, len(self.watched)), thread_name_prefix="warm")

    def serve(self, *, poll_s: float = 0.5) -> None:
        """Until the cap is spent (RestartCapSpentError) or a signal ends it (supervisor.Stop)."""
        try:
            while True:
                self.tick()
                time.sleep(poll_s)
        finally:
            self.checks.shutdown(wait=False, cancel_futures=True)
            self.warm_ups.shutdown(wait=False, cancel_futures=True)

    def tick(self) -> None:
        now = self.clock()
        statuses = self._probe(now)
        for w in self.watched:
            if w.phase is Phase.SERVING:
                self._serving(w, statuses.get(w.role.name, "skip"), now)
            elif w.phase is Phase.WAITING and now >= w.until and not self._gpu_busy(w):
                self._start(w, now)
            elif w.phase is Phase.STARTING:
                self._starting(w, now)
            elif w.phase is Phase.WARMING:
                self._warming(w, now)

    def _probe(self, now: float) -> dict[str, int | None]:
        """The /health statuses that came back since the last tick. Every check_every_s all SERVING roles are asked
        at once, in threads: a server slow to answer (a busy CPU box: seconds) must not delay seeing an exit."""
        done = {name: future.result() for name, future in self.pending.items() if future.done()}
        for name in done:
            del self.pending[name]
        if not self.pending and now >= self.next_check:
            self.next_check = now + self.limits.check_every_s
            for w in self.watched:
                if w.phase is Phase.SERVING and w.role.is_running:
                    self.pending[w.role.name] = self.checks.submit(health_answer, w.role.command.url,
                                                                   timeout_s=self.limits.check_timeout_s)
        return done

    def _serving(self, w: Watched, status, now: float) -> None:  # noqa: ANN001 (int | None | "skip")
        if not w.role.is_running:
            return self._fail(w, w.role.exit_reason, now)
        if status == "skip":
            return None
        if status == SLOW:  # busy is not dead: only a long silence counts (RestartLimits.hung_checks)
            w.slow_checks += 1
            if w.slow_checks >= self.limits.hung_checks:
                return self._fail(w, f"{w.role.name} gave no answer to {w.slow_checks} health checks in a row "
                                     f"({self.limits.check_timeout_s:g} s each; log {w.role.log_path})", now)
            return None
        w.slow_checks = 0
        w.missed_checks = 0 if is_alive(w.role, status) else w.missed_checks + 1
        if w.missed_checks >= self.limits.unhealthy_checks:
            why = f"HTTP {status}" if status is not None else "no answer"
            return self._fail(w, f"{w.role.name} failed {w.missed_checks} health checks in a row ({why}; log "
                                 f"{w.role.log_path})", now)
        return None

    def _starting(self, w: Watched, now: float) -> None:
        if not w.role.is_running:
            why = start_failure(w.role.log_path, w.role.log_start)
            return self._fail(w, f"{w.role.exit_reason} before it was healthy{f'; {why}' if why else ''}", now)
        if health_status(w.role.command.url, timeout_s=2.0) == 200:
            if self.warmer is not None and w.role.name in self.warmer.bursts:
                w.phase, w.warm_up = Phase.WARMING, self.warm_ups.submit(self.warmer.warm, w.role)
                return self._event("warming", w, f"{w.role.name} healthy again, warming up before it serves")
            return self._serving_again(w, now)
        if now > w.until:
            return self._fail(w, f"{w.role.name} not healthy {self.start_timeout_s:.0f} s after its restart", now)
        return None

    def _warming(self, w: Watched, now: float) -> None:
        if not w.role.is_running:
            return self._fail(w, f"{w.role.exit_reason} during its warm-up", now)
        if w.warm_up is None or not w.warm_up.done():
            return None
        error = w.warm_up.exception()
        if error is not None:
            return self._fail(w, str(error), now)
        return self._serving_again(w, now, warm_s=round(w.warm_up.result(), 2))

    def _serving_again(self, w: Watched, now: float, **fields: object) -> None:
        w.phase, w.missed_checks, w.slow_checks, w.warm_up = Phase.SERVING, 0, 0, None
        warm = f" (warm-up {fields['warm_s']:.1f} s)" if "warm_s" in fields else ""
        self._event("serving", w, f"{w.role.name} serving again, {now - w.down_since:.1f} s after it failed{warm}",
                    down_s=round(now - w.down_since, 2), **fields)

    def _fail(self, w: Watched, cause: str, now: float) -> None:
        if self.warmer is not None:
            self.warmer.mark_cold(w.role)  # before its restart can answer /health: the proxy waits for the warm-up
        _kill_group(w.role)
        if w.phase is Phase.SERVING:
            w.down_since = now
        backoff = w.ledger.admit(now)
        if backoff is None:
            self._event("cap_spent", w, f"{cause}; restart cap ({cap_text(self.limits)}) spent", cause=cause)
            raise RestartCapSpentError(f"{cause}; {w.role.name} failed {w.ledger.count} times within "
                                       f"{self.limits.window_s:.0f} s, the restart cap ({cap_text(self.limits)}) is "
                                       f"spent; every other role stopped")
        w.phase, w.until = Phase.WAITING, now + backoff
        self._event("failed", w, f"{cause}; restart {w.ledger.count} of {self.limits.max_restarts} in "
                                 f"{backoff:.0f} s", cause=cause, backoff_s=backoff)

    def _start(self, w: Watched, now: float) -> None:
        w.role = self.roles.start_again(w.role)
        w.phase, w.until = Phase.STARTING, now + self.start_timeout_s
        self._event("restarting", w, f"{w.role.name} started again (pid {w.role.popen.pid})")

    def _gpu_busy(self, w: Watched) -> bool:
        mine = set(w.role.command.gpus or ())
        return bool(mine) and any(o.phase in (Phase.STARTING, Phase.WARMING)
                                  and mine & set(o.role.command.gpus or ())
                                  for o in self.watched if o is not w)

    def _event(self, event: str, w: Watched, message: str, **fields: object) -> None:
        line = {"t": time.time(), "event": event, "role": w.role.name, "restarts": w.ledger.count, **fields}
        with open(self.log_path, "a") as out:
            out.write(json.dumps(line) + "\n")
        self.on_message(f"{event}: {message}")


def _kill_group(role: RunningRole) -> None:
    """SIGKILL what is left of a failed role's group (an API server that exited leaves its engine core)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(role.popen.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        role.popen.wait(timeout=10)
    wait_groups_gone([role.popen.pid], timeout_s=10)


def read_events(run_dir: Path) -> list[dict]:
    """The restart events of a run folder, in order (none when nothing failed)."""
    path = run_dir / RESTART_LOG
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
