"""`launch` as a supervisor: serve until a role dies (`--restart never`) or its restart cap is spent
(`--restart on-failure`, role_watch.py) or a signal comes, stop every role, exit with a code that says which (a
restart-on-failure supervisor such as systemd or Kubernetes acts on it).

- a role exited (never) or failed past the cap (on-failure): exit 1, naming the role, its exit code (or the signal
  that killed it, or its failed health checks) and its log;
- SIGINT: 130, SIGTERM: 143, SIGHUP: 129 (128 + the signal number, the shell's convention).

SIGINT is handled explicitly: a non-interactive shell starts background jobs with SIGINT ignored, and Python then
installs no KeyboardInterrupt handler, so `kill -INT` would do nothing.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from hybridserve.core.common.errors import HybridserveError
from hybridserve.core.launch.launch_plan import LaunchPlan
from hybridserve.core.supervise.health import ProgressCallback
from hybridserve.core.supervise.process import RunningRole
from hybridserve.core.supervise.restart import RestartLimits, RestartPolicy

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Stop(Exception):
    """Raised in the main thread by the first SIGINT / SIGTERM / SIGHUP, so the `started` context stops every role."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class RoleExitedError(HybridserveError):
    """A role exited while serving; every other role has been stopped (exit 1)."""

    exit_code = 1


class StoppedBySignalError(HybridserveError):
    """The launcher was asked to stop; every role has been stopped (exit 128 + the signal number)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}; every role stopped")
        self.exit_code = 128 + signum


class Trigger:
    """Whether the next stop signal raises `Stop`: only the first does, and none once teardown has begun."""

    def __init__(self) -> None:
        self.is_armed = True

    def disarm(self) -> None:
        self.is_armed = False


@contextlib.contextmanager
def stop_on_signals() -> Iterator[Trigger]:
    """Turn the first stop signal into `Stop` while the block runs; later ones are ignored, so they cannot cut
    the teardown short. The handlers are installed even where a signal was ignored (background jobs)."""
    trigger = Trigger()

    def _raise(signum: int, _frame: object) -> None:
        if trigger.is_armed:
            trigger.disarm()
            raise Stop(signum)

    previous = {sig: signal.signal(sig, _raise) for sig in STOP_SIGNALS}
    try:
        yield trigger
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def exit_reason(role: RunningRole) -> str:
    return role.exit_reason


def wait_for_exit(roles: list[RunningRole], *, poll_s: float = 0.5) -> RunningRole:
    """Block until a role exits and return it (a signal raises `Stop` out of here instead)."""
    while True:
        for role in roles:
            if not role.is_running:
                return role
        time.sleep(poll_s)


def supervise(plan: LaunchPlan, run_dir: Path, *, timeout_s: float, on_progress: ProgressCallback | None = None,
              on_serving: Callable[[list[RunningRole]], None] | None = None,
              on_stopping: Callable[[str], None] | None = None,
              restart: RestartPolicy = RestartPolicy.NEVER, limits: RestartLimits = RestartLimits(),
              on_restart: Callable[[str], None] | None = None) -> None:
    """Start the plan, call `on_serving` once every role is healthy, and serve until something stops it;
    `on_stopping` hears why a role's exit stops the others before the teardown begins. With `restart` on-failure a
    failed role is started again (role_watch.py; `on_restart` hears each event) until the cap is spent.

    Never returns normally: raises RoleExitedError, RestartCapSpentError or StoppedBySignalError once every role is
    stopped (or CouldNotRunError when a role fails to start)."""
    from hybridserve.core.supervise.role_watch import RestartCapSpentError, RoleWatch
    from hybridserve.core.supervise.runner import started

    with stop_on_signals() as trigger:
        try:
            with started(plan, run_dir, timeout_s=timeout_s, on_progress=on_progress) as roles:
                if on_serving is not None:
                    on_serving(roles)
                if restart is RestartPolicy.NEVER:
                    died = wait_for_exit(roles)
                    why = f"{exit_reason(died)}; every other role stopped"
                else:
                    try:
                        RoleWatch(roles, limits=limits, start_timeout_s=timeout_s, on_message=on_restart).serve()
                    except RestartCapSpentError as spent:
                        why = str(spent)
                trigger.disarm()  # the teardown that follows must not be cut short by a signal
                if on_stopping is not None:
                    on_stopping(why.removesuffix("; every other role stopped"))
        except Stop as stop:
            raise StoppedBySignalError(stop.signum) from None
    if restart is RestartPolicy.NEVER:
        raise RoleExitedError(why)
    raise RestartCapSpentError(why)
