"""Start role processes in their own process groups, with logs in a run folder, and stop them without orphans.

Each child gets its own session (`setsid`), so stopping a role signals its whole group: vLLM's API server, its
engine core and worker processes all go, and the ports are freed. Stopping is SIGTERM, a grace period, then
SIGKILL for what is left. Each role also dies with the launcher (guard.py: parent-death signal + guard process).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

from hybridserve.core.common.errors import CouldNotRunError
from hybridserve.core.launch.keys import read_key
from hybridserve.core.launch.launch_plan import RoleCommand
from hybridserve.core.supervise.guard import wait_groups_gone, wrapped


class RunningRole:
    """A started role: its command, its process (group leader) and its log file."""

    def __init__(self, command: RoleCommand, popen: subprocess.Popen, log_path: Path, log_start: int = 0) -> None:
        self.command, self.popen, self.log_path = command, popen, log_path
        self.log_start = log_start  # where this start's lines begin: a restart appends to the same log

    @property
    def name(self) -> str:
        return self.command.name

    @property
    def is_running(self) -> bool:
        return self.popen.poll() is None

    @property
    def exit_reason(self) -> str:
        """How it ended, for a message: "decode-0 was killed by SIGKILL (log ...)" or "... exited with code 0 ..."."""
        code = self.popen.returncode
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        return f"{self.name} {how} (log {self.log_path})"

    def log_tail(self, num_lines: int = 5) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return " | ".join(line.strip() for line in lines[-num_lines:])


def start_role(command: RoleCommand, run_dir: Path) -> RunningRole:
    """Start one role; stdout and stderr go to `<run_dir>/<name>.log`, its pid to `<name>.pid`; cwd: the run folder."""
    run_dir.mkdir(parents=True, exist_ok=True)
    log_path = run_dir / f"{command.name}.log"
    env = child_env(command, run_dir)
    with open(log_path, "ab") as log:
        log_start = log.tell()
        try:
            popen = subprocess.Popen(wrapped(command.argv), env=env, cwd=run_dir, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as exc:
            raise CouldNotRunError(f"{command.name}: cannot start {command.argv[0]} ({exc})") from None
    (run_dir / f"{command.name}.pid").write_text(f"{popen.pid}\n")  # = its process group id (own session)
    return RunningRole(command, popen, log_path, log_start)


def child_env(command: RoleCommand, run_dir: Path) -> dict[str, str]:
    """The caller's environment with the role's variables on top; PYTHONPATH is prepended, not replaced; each
    secret variable read from its key file (relative: in the run folder) here, so that it is in no plan or log."""
    env = {**os.environ, **dict(command.env)}
    inherited = os.environ.get("PYTHONPATH")
    if "PYTHONPATH" in dict(command.env) and inherited:
        env["PYTHONPATH"] = dict(command.env)["PYTHONPATH"] + os.pathsep + inherited
    for name, path in command.secret_env:
        env[name] = read_key(run_dir / path, what=f"{command.name}: {name} from")
    return env


# The proxy's share of the grace period: what it forwards when stopped is a prefill hop (max_tokens=1) or a decode
# hop that fails at once when decode is gone.
FRONT_GRACE_S = 5.0
ENGINE_GRACE_S = 15.0
GROUPS_GONE_S = 5.0
# the longest stop_roles takes: the fronts' grace, the engines', then their groups emptied
STOP_BUDGET_S = FRONT_GRACE_S + ENGINE_GRACE_S + GROUPS_GONE_S


def stop_roles(roles: Iterable[RunningRole], *, grace_s: float = ENGINE_GRACE_S) -> None:
    """Stop the front first, then the engines: SIGTERM each wave's process groups, wait up to its grace period,
    SIGKILL the groups still alive. Front first because an engine stopped under a forwarded request keeps that
    HTTP connection open and uvicorn waits for it: with every role signalled at once, a prefill server whose
    engine had stopped held the proxy's follow-up request until SIGKILL, 15 s (seen in make test)."""
    roles = list(roles)
    fronts = [role for role in roles if not role.command.role.is_engine]
    engines = [role for role in roles if role.command.role.is_engine]
    _stop_wave(fronts, min(grace_s, FRONT_GRACE_S))
    _stop_wave(engines, grace_s)
    # the leader's children (vLLM's engine core, workers) are gone only once their group is empty
    wait_groups_gone([role.popen.pid for role in roles], timeout_s=GROUPS_GONE_S)


def _stop_wave(roles: list[RunningRole], grace_s: float) -> None:
    for role in roles:
        _signal_group(role, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for role in roles:
        try:
            role.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for role in roles:
        _signal_group(role, signal.SIGKILL)  # also reaps grandchildren the leader left behind
        try:
            role.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def kill_role(role: RunningRole) -> None:
    """SIGKILL a role's whole group at once (fault tests: a server that dies without warning)."""
    _signal_group(role, signal.SIGKILL)
    role.popen.wait(timeout=10)


def stop_group(popen: subprocess.Popen, *, sig: signal.Signals = signal.SIGTERM, grace_s: float = 60.0) -> None:
    """Signal the process group that `popen` leads (a launcher, a server), wait up to grace_s for its leader, then
    SIGKILL the group if the leader is still alive. For one process started with start_new_session=True."""
    if popen.poll() is not None:
        return
    try:
        os.killpg(popen.pid, sig)
        popen.wait(timeout=grace_s)
    except ProcessLookupError:  # the group ended between the poll and the signal
        popen.wait()
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):  # it may end just after the grace
            os.killpg(popen.pid, signal.SIGKILL)
        popen.wait()


def _signal_group(role: RunningRole, sig: signal.Signals) -> None:
    try:
        os.killpg(role.popen.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
