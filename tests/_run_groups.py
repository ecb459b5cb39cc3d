"""Test clean-up: SIGKILL every role process group whose pid file a launch run folder left (whatever happened)."""

from __future__ import annotations

import os
import signal
from pathlib import Path


def kill_run_groups(runs: Path) -> None:
    for pid_file in runs.glob("*/*.pid"):
        try:
            os.killpg(int(pid_file.read_text()), signal.SIGKILL)
        except (ProcessLookupError, PermissionError, ValueError):
            pass
