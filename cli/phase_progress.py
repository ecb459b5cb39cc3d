"""A progress bar per phase of a long run (bench's targets, validate's deployments) on stderr, the run stoppable by
SIGTERM/SIGHUP as by Ctrl-C: it unwinds, so whatever servers the run started are stopped, and the user reads one line
saying what stopped it, not a traceback."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from hybridserve.cli.console import err_console

T = TypeVar("T")
OnProgress = Callable[[str, int, int], None]


def run_with_phase_progress(work: Callable[[OnProgress], T], before: str, starting: str = "") -> T:
    """`work(on_progress)`, where on_progress(phase, done, total) draws one bar a phase. A new phase's bar reads
    `phase + starting` until its first update. A signal stops it with "stopped by SIG... before `before`"."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from hybridserve.core.common.errors import CouldNotRunError
    from hybridserve.core.supervise.supervisor import Stop, stop_on_signals

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err_console, transient=True) as progress:
        tasks: dict[str, int] = {}

        def on_progress(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                tasks[phase] = progress.add_task(phase + starting, total=total)
            progress.update(tasks[phase], completed=done, description=phase)

        try:
            with stop_on_signals():  # SIGTERM/SIGHUP unwind like Ctrl-C: started servers are stopped
                return work(on_progress)
        except Stop as stop:
            raise CouldNotRunError(f"stopped by {stop} before {before}") from None
