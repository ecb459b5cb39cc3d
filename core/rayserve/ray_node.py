"""A Ray node that launch starts and stops itself (`launch --engine ray` without --ray-address; the tests' nodes).

`ray start --block` in a session of its own: the node's processes (GCS, raylet, workers, and the vLLM engine
processes the workers start) are its descendants. Stopping takes every descendant, by process id, never by name:
`ray stop` would end every Ray process on the machine, someone else's too. The node's temporary folder is short
(Ray's socket paths must fit 107 bytes) and removed afterwards.

The engine key is Ray's cluster token (RAY_AUTH_MODE=token, RAY_AUTH_TOKEN_PATH: the key's file, never its text on
a command line): every node and driver must hold it to talk to the cluster, and the engines have no HTTP port.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hybridserve.core.common.errors import CouldNotRunError

RAY_PORT = 6379  # Ray's default GCS port
# A node is stopped after Serve took the app down (deploy.take_down): its engines are gone by then, and what is left
# are Ray's own processes. On a head they did not all end on SIGTERM: in the two-namespace test the gcs_server, the
# autoscaler monitor, the Serve controller and proxy actors and `ray start --block` itself were still there after 30 s
# (2026-12-05), and were SIGKILLed then. `ray stop` gives them 16 s by default; 10 s is past every exit seen.
STOP_GRACE_S = 10.0


def auth_env(token_file: Path | None) -> dict[str, str]:
    """The environment that makes a node or a driver use the cluster token in `token_file`."""
    return {} if token_file is None else {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_file)}


class LocalNode:
    """One `ray start --block` process and what it started."""

    def __init__(self, *, address: str, resources: dict[str, float], num_cpus: int, log_path: Path,
                 head: str | None = None, port: int = RAY_PORT, token_file: Path | None = None,
                 wrap: list[str] | None = None) -> None:
        """`head`: None starts a head on `address`; else the head's address to join. `wrap`: a prefix for the
        command (the tests' `ip netns exec NS`)."""
        self.temp_dir = Path(tempfile.mkdtemp(prefix="hs-ray-"))
        role = ["--head", "--port", str(port), "--include-dashboard=false"] if head is None else [
            "--address", f"{head}:{port}"]
        self.argv = [*(wrap or []), sys.executable, "-m", "ray.scripts.scripts", "start", "--block", *role,
                     "--node-ip-address", address, "--num-cpus", str(num_cpus),
                     "--resources", json.dumps(resources, separators=(",", ":")),
                     "--temp-dir", str(self.temp_dir), "--disable-usage-stats"]
        self.address, self.port, self.log_path = address, port, log_path
        self.env = {**os.environ, **auth_env(token_file)}
        self.popen: subprocess.Popen | None = None

    @property
    def gcs_address(self) -> str:
        return f"{self.address}:{self.port}"

    def start(self) -> LocalNode:
        with open(self.log_path, "ab") as log:
            self.popen = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                          start_new_session=True)
        return self

    def wait_up(self, timeout_s: float = 120.0) -> None:
        """Until the node says it started (`ray start` prints "Ray runtime started"), or exits."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.popen is not None and self.popen.poll() is not None:
                raise CouldNotRunError(f"ray start exited with code {self.popen.returncode} (log {self.log_path}): "
                                       f"{_tail(self.log_path)}")
            if "Ray runtime started" in self.log_path.read_text(errors="replace"):
                return
            time.sleep(0.5)
        raise CouldNotRunError(f"ray start did not come up in {timeout_s:.0f} s (log {self.log_path})")

    def descendants(self) -> list[int]:
        if self.popen is None:
            return []
        import psutil

        with contextlib.suppress(psutil.NoSuchProcess):
            return [p.pid for p in psutil.Process(self.popen.pid).children(recursive=True)]
        return []

    def stop(self) -> list[int]:
        """SIGTERM the node's group and every descendant, SIGKILL what is left after the grace; returns the pids
        that had to be killed."""
        if self.popen is None:
            return []
        pids = self.descendants()
        _signal([self.popen.pid, *pids], signal.SIGTERM)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline and _alive([self.popen.pid, *pids]):
            time.sleep(0.2)
        left = _alive([self.popen.pid, *pids])
        _signal(left, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait()
        self._keep_logs()
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        return left

    def _keep_logs(self) -> None:
        """The session's logs (GCS, raylet, Serve, every replica and engine) beside this node's own log."""
        logs = (self.temp_dir / "session_latest").resolve() / "logs"
        if logs.is_dir():
            target = self.log_path.with_suffix(".logs")
            with contextlib.suppress(OSError):
                shutil.copytree(logs, target, dirs_exist_ok=True, ignore_dangling_symlinks=True)


def _signal(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _alive(pids: list[int]) -> list[int]:
    """The pids still running (a zombie counts as gone)."""
    out = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            out.append(pid)
    return out


def _tail(path: Path, num_lines: int = 5) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-num_lines:])
    except OSError:
        return ""
