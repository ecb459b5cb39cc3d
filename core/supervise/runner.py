"""Run a launch plan on this machine: start each role, wait until all are healthy and warm, stop all on the way out."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

from hybridserve.core.common.contracts import LAUNCHER_PID_FILE, PLAN_FILE  # a later launch reads both (stale_run.py)
from hybridserve.core.launch.gpu_shares import start_waves
from hybridserve.core.launch.keys import write_new_key
from hybridserve.core.launch.launch_plan import LaunchPlan, RoleCommand
from hybridserve.core.launch.seqs_fit import kv_cache_flag
from hybridserve.core.supervise.guard import Guard
from hybridserve.core.supervise.health import ProgressCallback, wait_healthy
from hybridserve.core.supervise.process import RunningRole, start_role, stop_roles
from hybridserve.core.supervise.start_phase import WAITING
from hybridserve.core.supervise.warming import Warmer


def new_run_dir(root: Path, role: str) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    path = root / f"{stamp}-{role}"
    suffix = 1
    while path.exists():
        path, suffix = root / f"{stamp}-{role}-{suffix}", suffix + 1
    path.mkdir(parents=True)
    return path


class StartedRoles(list):
    """The running roles of one run (a list of RunningRole), each watched by the run's guard; a role that died can
    be started again in its place (role_watch.py), its log appended to."""

    def __init__(self, run_dir: Path, guard: Guard) -> None:
        super().__init__()
        self.run_dir, self.guard = run_dir, guard
        self.warmer: Warmer | None = None  # the run's warm-ups (warming.py), which restarts repeat

    def start(self, command: RoleCommand) -> RunningRole:
        role = start_role(command, self.run_dir)
        self.append(role)
        self.guard.watch(role.popen.pid)  # = its process group id (own session)
        return role

    def start_again(self, old: RunningRole) -> RunningRole:
        """Start `old`'s command again in its place (its group must be gone: same ports)."""
        role = start_role(old.command, self.run_dir)
        self[self.index(old)] = role
        self.guard.watch(role.popen.pid)
        return role


@contextlib.contextmanager
def started(plan: LaunchPlan, run_dir: Path, *, timeout_s: float = 300.0,
            on_progress: ProgressCallback | None = None) -> Iterator[StartedRoles]:
    """Start every command of the plan (engines first, the proxy when they are healthy); always stop them all.
    A guard process (guard.py) stops them too if this process is killed without a chance to clean up."""
    run_dir.mkdir(parents=True, exist_ok=True)
    _write_plan(plan, run_dir)
    if plan.engine_key_file is not None and not plan.engine_key_file.is_absolute():
        write_new_key(run_dir / plan.engine_key_file)  # this deployment's engine key, mode 0600 (keys.py)
    (run_dir / LAUNCHER_PID_FILE).write_text(f"{os.getpid()}\n")
    guard = Guard()
    roles = StartedRoles(run_dir, guard)
    start = roles.start
    warmer = roles.warmer = Warmer.of_plan(plan, run_dir, timeout_s=timeout_s, on_progress=on_progress)

    try:
        engines = {c.name: c for c in plan.commands if c.role.is_engine}
        fixed_kv = frozenset(name for name, c in engines.items()  # vLLM skips their free-memory profile
                             if c.gpus and kv_cache_flag(tuple(c.argv)) is not None)
        waves = start_waves([(c.name, c.gpus or ()) for c in engines.values()], fixed_kv)  # GPU sharers one by one
        for name in (n for wave in waves[1:] for n in wave):
            if on_progress is not None:
                on_progress(name, WAITING)
        for wave in waves:
            wave_roles = [start(engines[name]) for name in wave]
            wait_healthy(wave_roles, timeout_s=timeout_s, on_progress=warmer.heard)
            warmer.warm_all(wave_roles)  # before the next wave and the proxy: no traffic meets a cold engine
        proxies = [start(c) for c in plan.commands if not c.role.is_engine]
        wait_healthy(proxies, timeout_s=min(timeout_s, 60.0), on_progress=on_progress)
        yield roles
    finally:
        stop_roles(roles)
        guard.release()


def _write_plan(plan: LaunchPlan, run_dir: Path) -> None:
    data = [{"name": c.name, "argv": list(c.argv), "env": dict(c.env), "url": c.url,
             "secret_env": {name: str(path) for name, path in c.secret_env}} for c in plan.commands]
    tmp = run_dir / f"{PLAN_FILE}.tmp"
    tmp.write_text(json.dumps(data, indent=2))
    tmp.rename(run_dir / PLAN_FILE)
