"""Refuse an output path up front, before any work: its folder must exist (nothing is created silently)."""

from __future__ import annotations

from pathlib import Path

from hybridserve.core.common.errors import InputError


def check_output_path(path: Path, flag: str) -> Path:
    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise InputError(f"{flag} {path}: is a folder; accepted: a file path in an existing folder")
    if not folder.is_dir():
        raise InputError(f"{flag} {path}: folder {folder} does not exist; accepted: a file path in an existing "
                         f"folder (create it first)")
    return path
