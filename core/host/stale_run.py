"""A run that is still alive: found by its run folder, so a port conflict says which run holds it and how to stop it.

A run folder (runner.py) holds `plan.json`, `launcher.pid` and one `<role>.pid` per role (each role leads its own
process group). A pid counts as this run's process only while it is alive and started no later than its pid file
was written: a pid the kernel reused for a later process does not count.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from hybridserve.core.common.contracts import LAUNCHER_PID_FILE, PLAN_FILE
from hybridserve.core.common.errors import InputError

_CLOCK_SLACK_S = 2.0  # the pid file is written just after the process starts; clock ticks are coarse


@dataclass(frozen=True, kw_only=True)
class LiveRun:
    run_dir: Path
    launcher_pid: int | None  # None: the launcher is gone (killed) and its roles were left behind
    role_pids: dict[str, int]  # role name -> process group id, alive ones only

    @property
    def how_to_stop(self) -> str:
        if self.launcher_pid is not None:
            return f"kill -TERM {self.launcher_pid}"
        return "kill -TERM -- " + " ".join(f"-{pid}" for pid in self.role_pids.values())


def find_live_runs(run_root: Path) -> list[LiveRun]:
    """Every run folder under `run_root` with at least one live role, oldest first."""
    runs = []
    for run_dir in sorted(p for p in run_root.glob("*") if (p / PLAN_FILE).is_file()):
        roles = {f.stem: pid for f in sorted(run_dir.glob("*.pid"))
                 if f.name != LAUNCHER_PID_FILE and (pid := _live_pid(f)) is not None}
        if roles:
            runs.append(LiveRun(run_dir=run_dir, launcher_pid=_live_pid(run_dir / LAUNCHER_PID_FILE),
                                role_pids=roles))
    return runs


def port_in_use_error(name: str, host: str, port: int, run_root: Path | None) -> InputError:
    """The refusal for a port in use: naming the live run of `run_root` that holds it, when there is one."""
    what = f"{name}: port {port} on {host} is in use"
    runs = find_live_runs(run_root) if run_root is not None and run_root.is_dir() else []
    if not runs:
        return InputError(f"{what}; accepted: a free port (stop what holds it or change the topology)")
    run = runs[-1]
    roles = ", ".join(f"{role} pid {pid}" for role, pid in run.role_pids.items())
    launcher = "its launcher is gone" if run.launcher_pid is None else f"launcher pid {run.launcher_pid}"
    return InputError(f"{what}: an earlier run is still running ({run.run_dir}: {roles}; {launcher}); "
                      f"stop it with: {run.how_to_stop}")


def _live_pid(pid_file: Path) -> int | None:
    try:
        pid = int(pid_file.read_text().strip())
        written = pid_file.stat().st_mtime
    except (OSError, ValueError):
        return None
    started = _start_time(pid)
    if started is None or started > written + _CLOCK_SLACK_S:
        return None
    return pid


def _start_time(pid: int) -> float | None:
    """When a live, non-zombie process started (seconds since the epoch); None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
    except (OSError, StopIteration, ValueError):
        return None
    fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": state is field 3, starttime field 22
    if fields[0] in ("Z", "X"):
        return None
    return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
