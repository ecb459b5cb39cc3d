"""`--help` off a terminal: typer renders help with rich at `typer.rich_utils.MAX_WIDTH` (None: the terminal's
width, 80 columns on a pipe, where every option wraps over 3-4 lines). These command classes render it
HELP_WIDTH wide when stdout is not a terminal, unless the user set TERMINAL_WIDTH (typer's own override)."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Iterator

from typer.core import TyperCommand, TyperGroup

# Wide enough that each option of every command holds its names, type, help and default on one line.
HELP_WIDTH = 200


@contextmanager
def help_width() -> Iterator[None]:
    from typer import rich_utils

    if sys.stdout.isatty() or rich_utils.MAX_WIDTH is not None:
        yield
        return
    rich_utils.MAX_WIDTH = HELP_WIDTH
    try:
        yield
    finally:
        rich_utils.MAX_WIDTH = None


class HelpCommand(TyperCommand):
    def format_help(self, ctx, formatter) -> None:  # noqa: ANN001 (click's types)
        with help_width():
            super().format_help(ctx, formatter)


class HelpGroup(TyperGroup):
    def format_help(self, ctx, formatter) -> None:  # noqa: ANN001
        with help_width():
            super().format_help(ctx, formatter)
