"""`hybridserve launch --role all` as a subprocess, the way a user starts it: the session's P/D deployment.

One topology file on loopback addresses 127.0.0.2 (prefill) and 127.0.0.3 (decode), the trained recall model,
async scheduling, and a fault switch file for the decode server (HYBRIDSERVE_FAULT_FILE in its `env`, empty: no
fault). validate_pd judges it as its pd-async candidate and arms each fault through the switch; launch_pd's tests
run on it afterwards and end by killing its decode server. Every role is stopped (process groups) even on failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from _ports import free_ports
from _run_groups import kill_run_groups

from hybridserve.core.common.fault_kind import FAULT_FILE_ENV
from hybridserve.core.deployments.deployed import Deployment
from hybridserve.core.deployments.target import RECALL_MODEL_DIR
from hybridserve.core.supervise.process import stop_group

START_TIMEOUT_S = 420
LAUNCH = [sys.executable, "-c", "from hybridserve.cli.app import main; main()", "launch"]


@dataclass
class Launched:
    launcher: subprocess.Popen
    run_dir: Path
    endpoints: dict[str, str]
    fault_file: Path
    killed_at: float = 0.0  # wall-clock time decode was killed

    @property
    def proxy(self) -> str:
        return self.endpoints["proxy"]

    @property
    def decode(self) -> str:
        return self.endpoints["decode-0"]

    def log(self, name: str) -> str:
        return (self.run_dir / f"{name}.log").read_text(errors="replace")

    def pid(self, name: str) -> int:
        return int((self.run_dir / f"{name}.pid").read_text())

    def as_validate_target(self) -> Deployment:
        """The same deployment as validate's `deployed` yields it: the proxy, the engine logs, the switch."""
        return Deployment(url=self.proxy, run_dir=self.run_dir, fault_file=self.fault_file,
                          engine_logs=(self.run_dir / "prefill-0.log", self.run_dir / "decode-0.log"))




def topology_yaml(fault_file: Path, model: Path = RECALL_MODEL_DIR, max_model_len: int = 4096,
                  proxy_timeout_s: int = 30, engine: dict | None = None, env: dict | None = None) -> str:
    """`engine`: more topology engine keys (kv_lease_s, max_num_seqs); `env`: more environment for both engines."""
    p, d = "127.0.0.2", "127.0.0.3"
    (p_port, p_side), (d_port, d_side) = free_ports(p, 2), free_ports(d, 2)
    proxy_port = free_ports("127.0.0.1", 1)[0]
    keys = {"async_scheduling": True, "max_model_len": max_model_len, **(engine or {})}
    more = "".join(f", {k}: '{v}'" for k, v in (env or {}).items())
    return (f"model: {model}\ndevice: cpu\nengine: {json.dumps(keys)}\n"
            f"prefill:\n  - {{host: {p}, port: {p_port}, side_channel_port: {p_side}, devices: [0], "
            f"env: {{{more[2:]}}}}}\n"
            f"decode:\n  - {{host: {d}, port: {d_port}, side_channel_port: {d_side}, "
            f"devices: [{max(0, (os.cpu_count() or 1) - 1)}], env: {{{FAULT_FILE_ENV}: '{fault_file}'{more}}}}}\n"
            f"proxy: {{host: 127.0.0.1, port: {proxy_port}, timeout_s: {proxy_timeout_s}}}\n")


def launch_all(tmp: Path, model: Path = RECALL_MODEL_DIR, max_model_len: int = 4096, proxy_timeout_s: int = 30,
               engine: dict | None = None, env: dict | None = None):
    """Start `launch --role all` in `tmp`; yields the Launched deployment, stops it on the way out."""
    fault_file = tmp / "fault"
    fault_file.write_text("")
    (tmp / "topology.yaml").write_text(topology_yaml(fault_file, model, max_model_len, proxy_timeout_s, engine, env))
    out, err = open(tmp / "launch.out", "w+"), open(tmp / "launch.err", "w+")
    # --restart never: launch_pd's last tests hold launch to issue 12's contract (decode dies, every role stops)
    launcher = subprocess.Popen([*LAUNCH, "--topology", str(tmp / "topology.yaml"), "--role", "all", "--json",
                                 "--run-dir", str(tmp / "runs"), "--timeout", str(START_TIMEOUT_S),
                                 "--restart", "never"],
                                stdout=out, stderr=err, start_new_session=True)
    try:
        yield _wait_started(launcher, tmp, fault_file)
    finally:
        _stop(launcher, tmp / "runs")
        out.close(), err.close()


def _wait_started(launcher: subprocess.Popen, tmp: Path, fault_file: Path) -> Launched:
    deadline = time.monotonic() + START_TIMEOUT_S + 60
    while time.monotonic() < deadline:
        text = (tmp / "launch.out").read_text()
        if text.strip().endswith("}"):
            info = json.loads(text)
            return Launched(launcher=launcher, run_dir=Path(info["run_dir"]), endpoints=info["endpoints"],
                            fault_file=fault_file)
        if launcher.poll() is not None:
            raise RuntimeError(f"launch exited {launcher.returncode}: {(tmp / 'launch.err').read_text()[-2000:]}")
        time.sleep(1)
    raise RuntimeError("launch --role all did not report its endpoints in time")


def _stop(launcher: subprocess.Popen, runs: Path) -> None:
    """SIGTERM the launcher (it stops its roles); then SIGKILL any role group still alive, whatever happened."""
    stop_group(launcher, grace_s=60)
    kill_run_groups(runs)
