"""One top-level handler: typed library errors become one line on stderr and an exit code."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import typer

from hybridserve.cli.console import err_console
from hybridserve.core.common.errors import HybridserveError


def guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a command: exit 2 refused / could not run, 1 check failed; tracebacks only with HYBRIDSERVE_DEBUG=1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except HybridserveError as exc:
            if os.environ.get("HYBRIDSERVE_DEBUG") == "1":
                raise
            err_console.print(f"error: {exc}", style="bold red", highlight=False, soft_wrap=True, markup=False)
            raise typer.Exit(exc.exit_code) from None

    return wrapper
