"""Wait until started roles answer `GET /health` with 200; fail fast, naming the role, when one exits."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence

from hybridserve.core.common.errors import CouldNotRunError
from hybridserve.core.supervise.process import RunningRole
from hybridserve.core.supervise.start_failure import start_failure
from hybridserve.core.supervise.start_phase import PhaseWatch, SERVING

ProgressCallback = Callable[[str, str], None]  # (role name, its start phase: start_phase.py; SERVING once healthy)


def is_healthy(url: str, *, timeout_s: float = 2.0) -> bool:
    return health_status(url, timeout_s=timeout_s) == 200


SLOW = "slow"  # health_answer: the server took the connection but gave no answer in time (busy, or hung)


def health_answer(url: str, *, timeout_s: float) -> int | str | None:
    """The HTTP status of `GET url/health`; SLOW when the server is there but did not answer in time; None when
    nothing is there (refused, unreachable)."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout_s) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except TimeoutError:
        return SLOW
    except urllib.error.URLError as exc:
        return SLOW if isinstance(exc.reason, TimeoutError) else None
    except (OSError, ValueError):
        return None


def health_status(url: str, *, timeout_s: float = 2.0) -> int | None:
    """The HTTP status of `GET url/health`; None when nothing answered in time."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout_s) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError, ValueError):
        return None


def wait_healthy(roles: Sequence[RunningRole], *, timeout_s: float, poll_s: float = 0.5,
                 on_progress: ProgressCallback | None = None) -> None:
    """Return when every role is healthy; raise CouldNotRunError when one exits or the deadline passes.
    `on_progress` hears each start phase an engine's log enters (start_phase.py), in order, and SERVING once healthy."""
    deadline = time.monotonic() + timeout_s
    pending = {role.name: role for role in roles}
    watches = {role.name: PhaseWatch(role.log_path, start=role.log_start,
                                     is_eager="--enforce-eager" in role.command.argv)
               for role in roles if role.command.role.is_engine}
    said: dict[str, str] = {}
    while pending:
        for name, role in list(pending.items()):
            if not role.is_running:
                why = start_failure(role.log_path, role.log_start) or role.log_tail()
                raise CouldNotRunError(f"{name} exited with code {role.popen.returncode} before it was healthy; "
                                       f"log {role.log_path}: {why}")
            healthy = is_healthy(role.command.url)
            # the log is read after the health check: an engine writes its start-up lines before it answers, so
            # a healthy one's phases are all there; a poll that comes after several phases names each
            phases = watches[name].update() if name in watches else []
            if healthy:
                phases.append(SERVING)
                del pending[name]
            for phase in phases:
                if on_progress and said.get(name) != phase:
                    said[name] = phase
                    on_progress(name, phase)
        if not pending:
            return
        if time.monotonic() > deadline:
            names = ", ".join(f"{n} ({watches[n].phase})" if n in watches else n for n in sorted(pending))
            raise CouldNotRunError(f"{names} not healthy after {timeout_s:.0f} s; logs in "
                                   f"{next(iter(pending.values())).log_path.parent}; --timeout waits longer")
        time.sleep(poll_s)
