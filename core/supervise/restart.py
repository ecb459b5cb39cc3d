"""launch's restart policy: which deaths of a role count as a failure, how long to wait before starting it again, and
when restarting stops (the cap), as pure values the serving loop (role_watch.py) consults.

- `on-failure` (the default): a role that exits, with any code, or fails `unhealthy_checks` health checks in a row,
  is stopped (its whole process group) and started again after a backoff of 1, 2, 4, 8, 16 s (at most 30). A
  vLLM API server exits with code 0 once its engine core has died (vllm/entrypoints/launchers/launcher.py
  `terminate_if_errored`, every 5 s unless VLLM_KEEP_ALIVE_ON_ENGINE_DEATH) and answers /health with 503 meanwhile
  (entrypoints/serve/instrumentator/health.py), so an exit is never "done": launch stops its roles itself.
  More than `max_restarts` failures of one role within `window_s` spend the cap: launch stops every role and exits 1
  naming it, as `never` does at once (a crash loop goes to systemd or Kubernetes, whose own restart acts then).
- `never`: the first role that exits ends the deployment (exit 1 naming it, every other role stopped: issue 12).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from hybridserve.core.common.choices import parse_choice


class RestartPolicy(enum.Enum):
    ON_FAILURE = "on-failure"
    NEVER = "never"

    @classmethod
    def parse(cls, text: str) -> RestartPolicy:
        return parse_choice(cls, text, what="--restart", aliases={"on_failure": "on-failure"})


@dataclass(frozen=True, kw_only=True)
class RestartLimits:
    max_restarts: int = 5  # restarts of one role allowed within window_s; one failure more spends the cap
    window_s: float = 600.0
    first_backoff_s: float = 1.0  # doubled for each restart still inside the window
    max_backoff_s: float = 30.0
    unhealthy_checks: int = 3  # failed health checks in a row that count as a failure
    check_every_s: float = 2.0
    check_timeout_s: float = 5.0  # a CPU server busy with a batch mostly answers /health within this
    # checks in a row with no answer in time before a role counts as hung: a busy vLLM CPU server left /health
    # unanswered for 15 s and more while it served (CI, a loaded 2-core box); 20 checks are about 2 minutes
    hung_checks: int = 20


class RestartLedger:
    """One role's failures inside the window: whether it may start again, and after how long."""

    def __init__(self, limits: RestartLimits) -> None:
        self.limits = limits
        self.failures: list[float] = []

    def admit(self, now: float) -> float | None:
        """Record a failure at `now`; the backoff before the restart, or None when the cap is spent."""
        self.failures = [t for t in self.failures if now - t < self.limits.window_s] + [now]
        count = len(self.failures)
        if count > self.limits.max_restarts:
            return None
        return min(self.limits.max_backoff_s, self.limits.first_backoff_s * 2 ** (count - 1))

    @property
    def count(self) -> int:
        return len(self.failures)


def cap_text(limits: RestartLimits) -> str:
    return f"{limits.max_restarts} restarts in {limits.window_s:.0f} s"
