"""Run a launch plan on this machine: start each role, wait until all are healthy, stop all on the way out."""

from __future__ import annotations

import contextlib
import json
import signal
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

from hybridserve.core.launch.plan import LaunchPlan
from hybridserve.core.launch.process import RunningRole, start_role, stop_roles
from hybridserve.core.launch.health import ProgressCallback, wait_healthy


def new_run_dir(root: Path, role: str) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    path = root / f"{stamp}-{role}"
    suffix = 1
    while path.exists():
        path, suffix = root / f"{stamp}-{role}-{suffix}", suffix + 1
    path.mkdir(parents=True)
    return path


@contextlib.contextmanager
def started(plan: LaunchPlan, run_dir: Path, *, timeout_s: float = 300.0,
            on_progress: ProgressCallback | None = None) -> Iterator[list[RunningRole]]:
    """Start every command of the plan (engines first, the proxy when they are healthy); always stop them all."""
    roles: list[RunningRole] = []
    run_dir.mkdir(parents=True, exist_ok=True)
    _write_plan(plan, run_dir)
    try:
        engines = [c for c in plan.commands if c.role.is_engine]
        others = [c for c in plan.commands if not c.role.is_engine]
        roles += [start_role(c, run_dir) for c in engines]
        wait_healthy(roles, timeout_s=timeout_s, on_progress=on_progress)
        proxies = [start_role(c, run_dir) for c in others]
        roles += proxies
        wait_healthy(proxies, timeout_s=min(timeout_s, 60.0), on_progress=on_progress)
        yield roles
    finally:
        stop_roles(roles)


class Stop(Exception):
    """Raised in the main thread on SIGTERM / SIGHUP so the `started` context stops every child."""


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into `Stop` while the block runs (Ctrl-C is already KeyboardInterrupt)."""
    def _raise(signum: int, _frame: object) -> None:
        raise Stop(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, _raise) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def wait_until_stopped(roles: list[RunningRole], *, poll_s: float = 1.0) -> str:
    """Block until Ctrl-C, `Stop` or a role exits; return why. The caller's `started` context then stops all."""
    try:
        while True:
            for role in roles:
                if not role.is_running:
                    return f"{role.name} exited with code {role.popen.returncode} (log {role.log_path})"
            time.sleep(poll_s)
    except KeyboardInterrupt:
        return "interrupted (Ctrl-C)"
    except Stop as stop:
        return f"stopped by {stop}"


def _write_plan(plan: LaunchPlan, run_dir: Path) -> None:
    data = [{"name": c.name, "argv": list(c.argv), "env": dict(c.env), "url": c.url} for c in plan.commands]
    tmp = run_dir / "plan.json.tmp"
    tmp.write_text(json.dumps(data, indent=2))
    tmp.rename(run_dir / "plan.json")
