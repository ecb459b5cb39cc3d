"""Nothing half-written: a result file is written to a temporary file beside it, then renamed onto it, so a reader
(or a crash, a Ctrl-C, a full disk) sees the old file or the whole new one, never part of one."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def replaced_on_success(path: Path, suffix: str = ".tmp") -> Iterator[Path]:
    """A temporary path beside `path` for the body to write; renamed onto `path` if the body ends without an error,
    removed if not. The file gets mode 0644, readable by others as results are meant to be (mkstemp's is 0600)."""
    path = Path(path)
    fd, name = tempfile.mkstemp(dir=path.parent if str(path.parent) else ".", prefix=f".{path.name}.", suffix=suffix)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        tmp.chmod(0o644)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_figure(path: Path, fig: object, *, dpi: int = 110) -> None:
    """A matplotlib figure as a PNG at `path`, whole or not at all; the figure is closed either way."""
    import matplotlib.pyplot as plt  # lazy: matplotlib only where a figure is drawn

    try:
        with replaced_on_success(path, suffix=".png") as tmp:
            fig.savefig(tmp, dpi=dpi)
    finally:
        plt.close(fig)


def write_text(path: Path, text: str) -> None:
    with replaced_on_success(path) as tmp:
        tmp.write_text(text)


def write_bytes(path: Path, data: bytes) -> None:
    with replaced_on_success(path) as tmp:
        tmp.write_bytes(data)
