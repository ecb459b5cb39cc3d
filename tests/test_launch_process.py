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

from _ports import free_port
from _run_groups import kill_run_groups

from hybridserve.core.common.errors import CouldNotRunError
from hybridserve.core.launch.launch_plan import Role, RoleCommand
from hybridserve.core.supervise.health import wait_healthy
from hybridserve.core.supervise.process import start_role, stop_group, stop_roles

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


def test_stop_group_sends_its_signal_and_kills_a_group_that_outlives_the_grace(tmp_path):
    # its own SIGINT handler: make test's side stream runs in a background shell, which starts children with SIGINT
    # ignored (and Python then leaves it ignored)
    polite = subprocess.Popen([sys.executable, "-c", "import signal, sys, time; signal.signal(signal.SIGINT, "
                               "lambda *_: sys.exit(3)); print('ready', flush=True); time.sleep(300)"],
                              stdout=subprocess.PIPE, start_new_session=True)
    assert polite.stdout.readline().strip() == b"ready"
    stop_group(polite, sig=signal.SIGINT, grace_s=30)
    assert polite.returncode == 3  # ended by the signal asked for, not by the SIGKILL
    stubborn = subprocess.Popen([sys.executable, "-c", STUBBORN], stdout=subprocess.PIPE, start_new_session=True)
    grandchild = int(stubborn.stdout.readline())
    start = time.monotonic()
    stop_group(stubborn, grace_s=0.5)
    assert stubborn.returncode == -signal.SIGKILL and time.monotonic() - start < 10
    time.sleep(0.2)
    assert not _alive(grandchild)
    stop_group(stubborn)  # already ended: nothing to signal, no error


# Writes "<name> term <t>" on SIGTERM, lingers `delay` s (a proxy finishing what it forwards), writes "<name> exit <t>".
LINGERING = ("import signal, sys, time\n"
             "name, record, delay = sys.argv[1], sys.argv[2], float(sys.argv[3])\n"
             "def note(what): open(record, 'a').write(f'{name} {what} {time.monotonic()}\\n')\n"
             "def on_term(*_): note('term'); time.sleep(delay); note('exit'); sys.exit(0)\n"
             "signal.signal(signal.SIGTERM, on_term)\n"
             "note('ready')\n"
             "time.sleep(300)\n")


def test_stop_ends_the_proxy_before_it_signals_an_engine(tmp_path):
    record = tmp_path / "record"
    roles = [start_role(RoleCommand(name=name, role=role, argv=(sys.executable, "-c", LINGERING, name, str(record),
                                                                   delay), env=(), host="127.0.0.1", port=9), tmp_path)
             for name, role, delay in (("decode-0", Role.DECODE, "0"), ("proxy", Role.PROXY, "0.5"))]
    deadline = time.monotonic() + 30
    while (not record.exists() or record.read_text().count("ready") < 2) and time.monotonic() < deadline:
        time.sleep(0.05)
    stop_roles(roles, grace_s=5.0)
    seen = {" ".join(line.split()[:2]): float(line.split()[2]) for line in record.read_text().splitlines()}
    assert seen["proxy term"] + 0.5 <= seen["proxy exit"] <= seen["decode-0 term"], seen
    assert all(role.popen.returncode == 0 for role in roles)


def test_a_role_that_exits_early_is_named_with_its_log(tmp_path):
    role = start_role(_command("broken", "import sys; print('cannot bind 8100'); sys.exit(3)"), tmp_path)
    with pytest.raises(CouldNotRunError, match=r"broken exited with code 3 before it was healthy; .*cannot bind 8100"):
        wait_healthy([role], timeout_s=30)


def test_a_role_that_never_answers_times_out(tmp_path):
    role = start_role(_command("silent", "import time; time.sleep(60)", port=free_port()), tmp_path)
    try:
        with pytest.raises(CouldNotRunError, match="silent not healthy after 1 s"):
            wait_healthy([role], timeout_s=1, poll_s=0.2)
    finally:
        stop_roles([role], grace_s=2)




LAUNCH = [sys.executable, "-c", "from hybridserve.cli.app import main; main()", "launch"]


def _launch_proxy(tmp_path: Path, *more: str, **popen) -> tuple[subprocess.Popen, int, int]:
    """`launch --role proxy` (no vLLM: seconds); returns the launcher, the proxy's port and its pid."""
    pytest.importorskip("uvicorn", reason="needs the cpu or cuda extra")
    port = free_port()
    launcher = subprocess.Popen([*LAUNCH, "--role", "proxy", "--json", "--base-port", str(port), "--run-dir",
                                 str(tmp_path / "runs"), "--timeout", "60", *more],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                                **popen)
    info = json.loads(_read_json(launcher))
    assert info["endpoints"] == {"proxy": f"http://127.0.0.1:{port}"}
    return launcher, port, int((Path(info["run_dir"]) / "proxy.pid").read_text())


def _cleanup(launcher: subprocess.Popen, runs: Path) -> None:
    if launcher.poll() is None:
        os.killpg(launcher.pid, signal.SIGKILL)
    kill_run_groups(runs)


def _port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _ignore_sigint() -> None:  # what a non-interactive shell does for a background job (`launch ... &`)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("sig,code,popen", [
    (signal.SIGTERM, 143, {}),
    (signal.SIGINT, 130, {"preexec_fn": _ignore_sigint}),
], ids=["sigterm-143", "sigint-while-ignored-130"])
def test_launch_stops_every_role_and_exits_128_plus_the_signal(tmp_path, sig, code, popen):
    launcher, port, proxy_pid = _launch_proxy(tmp_path, **popen)
    try:
        launcher.send_signal(sig)
        assert launcher.wait(timeout=30) == code
        assert f"stopped by {sig.name}; every role stopped" in launcher.stderr.read()
        assert not _alive(proxy_pid) and _port_is_free(port)
    finally:
        _cleanup(launcher, tmp_path / "runs")


def test_launch_exits_1_naming_the_role_that_died(tmp_path):
    launcher, port, proxy_pid = _launch_proxy(tmp_path, "--restart", "never")
    try:
        os.kill(proxy_pid, signal.SIGKILL)
        killed = time.monotonic()
        assert launcher.wait(timeout=30) == 1
        assert time.monotonic() - killed < 10
        last = launcher.stderr.read().strip().splitlines()[-1]
        assert last.startswith("error: proxy was killed by SIGKILL (log ") and "every other role stopped" in last
    finally:
        _cleanup(launcher, tmp_path / "runs")


# A role that answers /health and has a child of its own (as vLLM's API server has its engine core).
SERVER_WITH_CHILD = """
import http.server, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
print(child.pid, flush=True)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""
# The launcher's side, in a process the test can SIGKILL: `started` with that role, then wait forever.
LAUNCHER = """
import sys, time, types
from pathlib import Path
from hybridserve.core.launch.launch_plan import Role, RoleCommand
from hybridserve.core.supervise.runner import started
port = int(sys.argv[1])
command = RoleCommand(name="server", role=Role.PROXY, argv=(sys.executable, "-c", sys.argv[2], str(port)), env=(),
                      host="127.0.0.1", port=port)
with started(types.SimpleNamespace(commands=(command,), engine_key_file=None), Path(sys.argv[3]), timeout_s=60):
    print("serving", flush=True)
    time.sleep(300)
"""


def test_roles_and_their_children_die_with_a_sigkilled_launcher(tmp_path):
    port = free_port()
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(port), SERVER_WITH_CHILD, str(tmp_path)],
                                stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert launcher.stdout.readline().strip() == "serving"
        server = int((tmp_path / "server.pid").read_text())
        child = int((tmp_path / "server.log").read_text().split()[0])
        assert _alive(server) and _alive(child)
        launcher.kill()  # no chance to clean up
        launcher.wait(timeout=10)
        deadline = time.monotonic() + 10
        while (_alive(server) or _alive(child)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(server) and not _alive(child)
        assert _port_is_free(port)
    finally:
        if launcher.poll() is None:
            launcher.kill()
        for pid_file in tmp_path.glob("*.pid"):
            try:
                os.killpg(int(pid_file.read_text()), signal.SIGKILL)
            except (ProcessLookupError, PermissionError, ValueError):
                pass


def test_a_later_launch_names_the_stale_run_holding_its_port(tmp_path):
    """A run folder whose role still holds the port (its launcher is gone): the refusal says how to clear it."""
    port = free_port()
    run_dir = tmp_path / "runs" / "20260101-000000-all"
    run_dir.mkdir(parents=True)
    (run_dir / "plan.json").write_text("[]")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    (run_dir / "launcher.pid").write_text(f"{gone.pid}\n")
    holder = subprocess.Popen([sys.executable, "-c", SERVER_WITH_CHILD, str(port)], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        holder.stdout.readline()
        (run_dir / "proxy.pid").write_text(f"{holder.pid}\n")
        while _port_is_free(port):
            time.sleep(0.05)
        result = subprocess.run([*LAUNCH, "--role", "proxy", "--base-port", str(port), "--run-dir",
                                 str(tmp_path / "runs")], capture_output=True, text=True, timeout=60)
        assert result.returncode == 2
        assert result.stderr.strip() == (
            f"error: proxy: port {port} on 127.0.0.1 is in use: an earlier run is still running ({run_dir}: proxy "
            f"pid {holder.pid}; its launcher is gone); stop it with: kill -TERM -- -{holder.pid}")
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
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
