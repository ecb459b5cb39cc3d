"""Warm up the engines of a run (warmup.py's burst, warm_send.py's requests) and tell the proxy which are warm.

At start, each start wave is warmed once healthy, before the next wave and before the proxy starts: an engine's
progress goes healthy -> warm-up (its requests) -> warm-up done in N s -> serving. After a restart (role_watch.py)
the engine is marked WARMING in the run's warm file from its failure on, so the proxy keeps client requests off it
until its burst is done (core/common/warm_state.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hybridserve.core.common.warm_state import WARM, WARM_FILE, WARMING, write_warm_state
from hybridserve.core.launch.launch_plan import LaunchPlan
from hybridserve.core.launch.warmup import WarmupBurst
from hybridserve.core.model.profiles import load_model
from hybridserve.core.supervise.health import ProgressCallback
from hybridserve.core.supervise.process import RunningRole
from hybridserve.core.supervise.start_phase import SERVING
from hybridserve.core.supervise.warm_send import engine_key, warm_up

HEALTHY = "healthy, not yet warm"


def warm_done(seconds: float) -> str:
    return f"warm-up done in {seconds:.1f} s"


class Warmer:
    """The warm-ups of one run's engines; `on_progress` hears each engine's phases (SERVING last)."""

    def __init__(self, bursts: dict[str, WarmupBurst], run_dir: Path, *, model: Path, model_name: str,
                 timeout_s: float, on_progress: ProgressCallback | None = None) -> None:
        self.bursts = bursts  # engine name -> its burst (engines without one are not here)
        self.run_dir, self.model, self.model_name = run_dir, model, model_name
        self.timeout_s, self.on_progress = timeout_s, on_progress
        self.seconds: dict[str, float] = {}  # the last warm-up of each engine
        self._vocab_size: int | None = None  # read from the model's config at the first warm-up

    @classmethod
    def of_plan(cls, plan: LaunchPlan, run_dir: Path, *, timeout_s: float,
                on_progress: ProgressCallback | None = None) -> Warmer:
        bursts = {c.name: c.warmup for c in plan.commands if c.warmup is not None}
        topology = plan.topology if bursts else None  # a plan with no burst needs no model
        return cls(bursts, run_dir, model=topology.model if topology else Path(),
                   model_name=topology.model_name if topology else "", timeout_s=timeout_s, on_progress=on_progress)

    @property
    def warm_file(self) -> Path:
        return self.run_dir / WARM_FILE

    def heard(self, name: str, phase: str) -> None:
        """wait_healthy's progress, where an engine that warms up next is healthy, not yet serving."""
        self._say(name, HEALTHY if phase == SERVING and name in self.bursts else phase)

    def warm_all(self, roles: Sequence[RunningRole]) -> None:
        """Warm every role of a start wave that has a burst, all at once; CouldNotRunError when one fails."""
        warming = [role for role in roles if role.name in self.bursts]
        if not warming:
            return
        with ThreadPoolExecutor(max_workers=len(warming), thread_name_prefix="warm") as pool:
            for future in [pool.submit(self.warm, role) for role in warming]:
                future.result()

    def warm(self, role: RunningRole) -> float | None:
        """Send `role` its burst and mark it WARM; the seconds it took (None: it has no burst)."""
        burst = self.bursts.get(role.name)
        if burst is None:
            return None
        self._say(role.name, burst.what())
        seconds = warm_up(role.command, burst, model_name=self.model_name, vocab_size=self.vocab_size,
                          key=engine_key(role.command, self.run_dir), timeout_s=self.timeout_s)
        self.seconds[role.name] = seconds
        write_warm_state(self.warm_file, role.command.url, WARM)
        self._say(role.name, warm_done(seconds))
        self._say(role.name, SERVING)
        return seconds

    def mark_cold(self, role: RunningRole) -> None:
        """From a failure on, until its next warm-up is done, the proxy keeps requests off `role`'s server."""
        if role.name in self.bursts:
            write_warm_state(self.warm_file, role.command.url, WARMING)

    @property
    def vocab_size(self) -> int:
        if self._vocab_size is None:
            self._vocab_size = load_model(str(self.model)).vocab_size
        return self._vocab_size

    def _say(self, name: str, phase: str) -> None:
        if self.on_progress is not None:
            self.on_progress(name, phase)
