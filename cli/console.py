"""The two consoles: results on stdout, messages and progress on stderr (so `--json` stays clean).

On a terminal rich fits output to the window. Written to a pipe or a file (CI logs, `| tee`, `| cat`) rich would
assume 80 columns and cut every table column to "…"; there the consoles widen to the table's natural width
instead (`--help`: see cli/help.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from typing import Any

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

_UNBOUNDED = 100_000


class FitConsole(Console):
    """A rich Console that, when not writing to a terminal, prints each table at the width it needs."""

    def print(self, *objects: Any, **kwargs: Any) -> None:
        width = self.fit_width(objects)
        if width is None:
            super().print(*objects, **kwargs)
            return
        saved, self._width = self._width, width
        try:
            super().print(*objects, **kwargs)
        finally:
            self._width = saved

    def fit_width(self, objects: tuple[Any, ...]) -> int | None:
        """The natural width of the widest table among `objects` when it exceeds the console's; else None."""
        if self.is_terminal:
            return None
        tables = [o for o in objects if isinstance(o, Table)]
        if not tables:
            return None
        options = self.options.update_width(_UNBOUNDED)
        need = max(Measurement.get(self, options, t).maximum for t in tables)
        return need if need > self.width else None


out_console = FitConsole()
err_console = FitConsole(stderr=True)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


@contextlib.contextmanager
def library_output_to_stderr() -> Iterator[None]:
    """While kernels load, compile and run: file descriptor 1 points at stderr, so what a library prints to stdout
    (Python or C) lands beside the progress messages, not in the results. On the H200, TileLang's compile log went to
    stdout and made `verify --backend flashqla --json` unparsable. Results are written after the block, to the
    restored stdout. Without a usable fd 1 or 2 (a closed stream) it changes nothing."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
        os.dup2(2, 1)
    except OSError:
        yield
        return
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
