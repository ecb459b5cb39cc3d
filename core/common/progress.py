"""Counting finished requests for a progress callback, the way bench's phases and validate's targets report."""

from __future__ import annotations

from collections.abc import Callable

ProgressCallback = Callable[[str, int, int], None]  # (what, done, total)


def counted(progress: ProgressCallback | None, what: str, total: int) -> Callable[[], None]:
    """Tell `progress` (what, 0, total) now; the returned function tells it (what, n, total) at its n-th call."""
    done = [0]
    if progress is not None:
        progress(what, 0, total)

    def on_done() -> None:
        done[0] += 1
        if progress is not None:
            progress(what, done[0], total)

    return on_done
