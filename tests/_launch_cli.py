"""`hybridserve launch ... --json` as a subprocess with any arguments: started, its endpoints read, always stopped.

Like tests/_launched.py (the session's P/D deployment) but for a deployment a test owns: the weightless model, the
vllm-router front end. Every role is stopped (SIGTERM to the launcher, then SIGKILL of any role group left).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from _run_groups import kill_run_groups

from hybridserve.core.supervise.process import stop_group

LAUNCH = [sys.executable, "-c", "from hybridserve.cli.app import main; main()", "launch"]


@dataclass
class Started:
    launcher: subprocess.Popen
    run_dir: Path
    endpoints: dict[str, str]

    def log(self, name: str) -> str:
        return (self.run_dir / f"{name}.log").read_text(errors="replace")

    def pid(self, name: str) -> int:
        return int((self.run_dir / f"{name}.pid").read_text())


@contextlib.contextmanager
def launched(tmp: Path, args: list[str], *, timeout_s: float = 420) -> Iterator[Started]:
    out, err = open(tmp / "launch.out", "w+"), open(tmp / "launch.err", "w+")
    own = ["--json", "--run-dir", str(tmp / "runs"), "--timeout", str(timeout_s)]  # before any `--` in args
    launcher = subprocess.Popen([*LAUNCH, *own, *args], stdout=out, stderr=err, start_new_session=True)
    try:
        yield _wait_started(launcher, tmp, timeout_s + 60)
    finally:
        stop_group(launcher, grace_s=60)
        kill_run_groups(tmp / "runs")
        out.close(), err.close()


def _wait_started(launcher: subprocess.Popen, tmp: Path, timeout_s: float) -> Started:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = (tmp / "launch.out").read_text()
        if text.strip().endswith("}"):
            info = json.loads(text)
            return Started(launcher=launcher, run_dir=Path(info["run_dir"]), endpoints=info["endpoints"])
        if launcher.poll() is not None:
            raise RuntimeError(f"launch exited {launcher.returncode}: {(tmp / 'launch.err').read_text()[-2000:]}")
        time.sleep(1)
    raise RuntimeError("launch did not report its endpoints in time")
