"""Role processes: whole process groups stop, a role that dies early is named, the launcher cleans up on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hybridserve.core.common.errors import CouldNotRunError
from hybridserve.core.launch.plan import Role, RoleCommand
from hybridserve.core.launch.process import start_role, stop_roles
from hybridserve.core.launch.health import wait_healthy

# A role that starts a grandchild in its own group and ignores SIGTERM: only a group SIGKILL ends both.
STUBBORN = ("import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']); "
            "print(p.pid, flush=True); time.sleep(300)")


def _command(name: str, code: str, port: int = 9) -> RoleCommand:
    return RoleCommand(name=name, role=Role.PROXY, argv=(sys.executable, "-c", code), env=(("HS_TEST", "1"),),
                       host="127.0.0.1", port=port)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().split()[2] if Path(f"/proc/{pid}/stat").exists() else "X"
    return state != "Z"


def test_stop_kills_the_whole_group_after_the_grace_period(tmp_path):
    role = start_role(_command("stubborn", STUBBORN), tmp_path)
    try:
        deadline = time.monotonic() + 30
        while not role.log_path.read_text().strip() and time.monotonic() < deadline:
            time.sleep(0.1)
        grandchild = int(role.log_path.read_text().split()[0])
        assert (tmp_path / "stubborn.pid").read_text().strip() == str(role.popen.pid)
        start = time.monotonic()
        stop_roles([role], grace_s=1.0)
        assert time.monotonic() - start < 10
        assert role.popen.returncode == -signal.SIGKILL
        time.sleep(0.2)
        assert not _alive(grandchild)
    finally:
        stop_roles([role], grace_s=0)


def test_a_role_that_exits_early_is_named_with_its_log(tmp_path):
    role = start_role(_command("broken", "import sys; print('cannot bind 8100'); sys.exit(3)"), tmp_path)
    with pytest.raises(CouldNotRunError, match=r"broken exited with code 3 before it was healthy; .*cannot bind 8100"):
        wait_healthy([role], timeout_s=30)


def test_a_role_that_never_answers_times_out(tmp_path):
    role = start_role(_command("silent", "import time; time.sleep(60)", port=_free_port()), tmp_path)
    try:
        with pytest.raises(CouldNotRunError, match="silent not healthy after 1 s"):
            wait_healthy([role], timeout_s=1, poll_s=0.2)
    finally:
        stop_roles([role], grace_s=2)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_launch_proxy_role_stops_on_sigterm(tmp_path):
    pytest.importorskip("uvicorn", reason="needs the cpu or cuda extra")
    port = _free_port()
    launcher = subprocess.Popen(
        [sys.executable, "-c", "from hybridserve.cli.app import main; main()", "launch", "--role", "proxy",
         "--json", "--base-port", str(port), "--run-dir", str(tmp_path), "--timeout", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        info = json.loads(_read_json(launcher))
        assert info["endpoints"] == {"proxy": f"http://127.0.0.1:{port}"}
        proxy_pid = int((Path(info["run_dir"]) / "proxy.pid").read_text())
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=30) == 0
        assert not _alive(proxy_pid)
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", port))
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
        for pid_file in tmp_path.glob("*/*.pid"):
            try:
                os.killpg(int(pid_file.read_text()), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass


def _read_json(launcher: subprocess.Popen) -> str:
    lines = []
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        line = launcher.stdout.readline()
        if not line:
            pytest.fail(f"launch exited: {launcher.stderr.read()[-1000:]}")
        lines.append(line)
        if line.startswith("}"):
            return "".join(lines)
    pytest.fail("no endpoints from launch --role proxy")
