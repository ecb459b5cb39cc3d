"""The NVIDIA MPS control daemon of this host, if one runs: found by its process and control pipe, never started or
stopped here (a daemon, not a setting of the card)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

PIPE_DIR_ENV = "CUDA_MPS_PIPE_DIRECTORY"
DEFAULT_PIPE_DIR = "/tmp/nvidia-mps"  # the daemon's default pipe directory
CONTROL = "nvidia-cuda-mps-control"


@dataclass(frozen=True, kw_only=True)
class MpsDaemon:
    """What this host's MPS control daemon serves: None when it is not running; `gpus` None: every GPU."""

    pipe_dir: Path
    gpus: tuple[int, ...] | None = None


def find_daemon(*, proc: Path = Path("/proc"), exists: Callable[[Path], bool] | None = None) -> MpsDaemon | None:
    """The running control daemon: a process named nvidia-cuda-mps-control, and its control pipe in the pipe
    directory; the GPUs it serves from its CUDA_VISIBLE_DEVICES (integer ids only; unset or unreadable: all)."""
    exists = exists or Path.exists
    pipe = pipe_dir()
    for pid_dir in _pids(proc):
        cmdline = _read(pid_dir / "cmdline").split(b"\0")[0]
        if Path(cmdline.decode(errors="replace")).name != CONTROL:
            continue
        environ = dict(item.split(b"=", 1) for item in _read(pid_dir / "environ").split(b"\0") if b"=" in item)
        pipe = Path(environ.get(PIPE_DIR_ENV.encode(), str(pipe).encode()).decode(errors="replace"))
        if exists(pipe / "control"):
            return MpsDaemon(pipe_dir=pipe, gpus=_gpu_ids(environ.get(b"CUDA_VISIBLE_DEVICES")))
    return None


def pipe_dir() -> Path:
    return Path(os.environ.get(PIPE_DIR_ENV, DEFAULT_PIPE_DIR))


def _pids(proc: Path) -> list[Path]:
    try:
        return [p for p in proc.iterdir() if p.name.isdigit()]
    except OSError:
        return []


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def _gpu_ids(value: bytes | None) -> tuple[int, ...] | None:
    if not value:
        return None
    parts = value.decode(errors="replace").split(",")
    return tuple(int(p) for p in parts) if all(p.strip().isdigit() for p in parts) else None
