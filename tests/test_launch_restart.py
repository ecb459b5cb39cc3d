"""`launch --restart on-failure`: a role that exits or fails its health checks is started again with backoff while
the others serve; past the cap every role stops and the role is named (no vLLM here: small HTTP servers)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from _ports import free_port
from _run_groups import kill_run_groups
from test_launch_process import _read_json

from hybridserve.core.common.errors import InputError
from hybridserve.core.launch.launch_plan import Role, RoleCommand
from hybridserve.core.supervise.guard import Guard
from hybridserve.core.supervise.health import health_answer
from hybridserve.core.supervise.process import stop_roles
from hybridserve.core.supervise.restart import RestartLedger, RestartLimits, RestartPolicy
from hybridserve.core.supervise.role_watch import RestartCapSpentError, RoleWatch, read_events
from hybridserve.core.supervise.runner import StartedRoles

LAUNCH = [sys.executable, "-c", "from hybridserve.cli.app import main; main()", "launch"]

# /health answers `status`; after `live_s` seconds the server exits with code 0 (vLLM's API server after its engine
# died); live_s 0: never exits
SERVER = """
import http.server, sys, threading, os
port, status, live_s = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
if live_s:
    threading.Timer(live_s, lambda: os._exit(0)).start()
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if not status:  # status 0: takes the request and never answers (a busy or hung server)
            threading.Event().wait()
        self.send_response(status); self.end_headers()
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", port), Health).serve_forever()
"""
FAST = RestartLimits(max_restarts=2, first_backoff_s=0.1, max_backoff_s=0.2, check_every_s=0.2, check_timeout_s=1.0)




def test_backoff_doubles_up_to_the_cap_and_old_failures_are_forgotten():
    ledger = RestartLedger(RestartLimits(max_restarts=5, window_s=600, first_backoff_s=1, max_backoff_s=10))
    assert [ledger.admit(t) for t in (0, 1, 2, 3, 4)] == [1, 2, 4, 8, 10]
    assert ledger.admit(5) is None  # the 6th failure within 10 minutes spends the cap
    fresh = RestartLedger(RestartLimits(max_restarts=1, window_s=60))
    assert fresh.admit(0) == 1 and fresh.admit(61) == 1  # the first failure left the window
    assert fresh.admit(62) is None


def test_restart_policy_is_parsed_once_and_a_wrong_one_named():
    assert RestartPolicy.parse("on-failure") is RestartPolicy.ON_FAILURE
    assert RestartPolicy.parse("never") is RestartPolicy.NEVER
    with pytest.raises(InputError, match="--restart always: accepted: on-failure, never"):
        RestartPolicy.parse("always")


def _roles(tmp_path: Path, *servers: tuple[str, Role, int, float]) -> StartedRoles:
    roles = StartedRoles(tmp_path, Guard())
    for name, role, status, live_s in servers:
        port = free_port()
        roles.start(RoleCommand(name=name, role=role, argv=(sys.executable, "-c", SERVER, str(port), str(status),
                                                                str(live_s)), env=(), host="127.0.0.1", port=port))
    deadline = time.monotonic() + 30  # as launch: the watch begins once every role answered
    while (not all(health_answer(r.command.url, timeout_s=0.3) is not None for r in roles)
           and time.monotonic() < deadline):
        time.sleep(0.05)
    return roles


def _serve_for(watch: RoleWatch, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        watch.tick()
        time.sleep(0.05)


def _serve_until(watch: RoleWatch, run_dir: Path, event: str, seconds: float = 20) -> None:
    """Serve until the run's events hold `event`, up to `seconds` (a loaded box checks and restarts late)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not any(e["event"] == event for e in read_events(run_dir)):
        _serve_for(watch, 0.2)


def test_a_server_that_exits_0_counts_as_failed_and_spends_the_cap_while_the_other_serves(tmp_path):
    roles = _roles(tmp_path, ("decode-0", Role.DECODE, 200, 1.5), ("prefill-0", Role.PREFILL, 200, 0))
    prefill_pid = roles[1].popen.pid
    messages: list[str] = []
    try:
        watch = RoleWatch(roles, limits=FAST, start_timeout_s=20, on_message=messages.append)
        start = time.monotonic()
        with pytest.raises(RestartCapSpentError, match=r"decode-0 exited with code 0 \(log .*decode-0 failed 3 "
                                                       r"times within 600 s, the restart cap \(2 restarts in 600 s\)"):
            _serve_for(watch, 60)
        assert time.monotonic() - start < 30
        events = [(e["event"], e["role"]) for e in read_events(tmp_path)]
        assert events[:2] == [("failed", "decode-0"), ("restarting", "decode-0")]
        assert ("serving", "decode-0") in events and events[-1] == ("cap_spent", "decode-0")
        assert [e for e, _ in events].count("restarting") == 2
        assert roles[1].popen.pid == prefill_pid and roles[1].is_running  # never touched
        assert any(m.startswith("failed: decode-0 exited with code 0") and "restart 1 of 2 in 0 s" in m
                   for m in messages), messages
    finally:
        stop_roles(roles, grace_s=1)
        roles.guard.release()


def test_an_engine_answering_503_is_restarted_and_a_proxy_answering_503_is_not(tmp_path):
    """vLLM answers /health with 503 once its engine core is dead; vllm-router answers 503 while a worker is out."""
    roles = _roles(tmp_path, ("decode-0", Role.DECODE, 503, 0), ("proxy", Role.PROXY, 503, 0))
    first_decode, proxy_pid = roles[0].popen.pid, roles[1].popen.pid
    try:
        watch = RoleWatch(roles, limits=FAST, start_timeout_s=1.5)
        _serve_for(watch, 1.5)
        _serve_until(watch, tmp_path, "restarting")  # three checks 0.2 s apart, then a restart: longer when loaded
        failed = [e for e in read_events(tmp_path) if e["event"] == "failed"]
        assert failed and failed[0]["role"] == "decode-0"
        assert "decode-0 failed 3 health checks in a row (HTTP 503; log " in failed[0]["cause"]
        assert roles[0].popen.pid != first_decode  # started again
        assert roles[1].popen.pid == proxy_pid and {e["role"] for e in read_events(tmp_path)} == {"decode-0"}
    finally:
        stop_roles(roles, grace_s=1)
        roles.guard.release()


def test_a_silent_engine_is_busy_until_hung_checks_then_restarted(tmp_path):
    """No answer in time is not a failure by itself (a busy vLLM CPU server left /health unanswered for 15 s and
    more while it served); only `hung_checks` of them in a row are."""
    from dataclasses import replace

    from hybridserve.core.supervise.health import SLOW

    roles = _roles(tmp_path, ("decode-0", Role.DECODE, 0, 0))
    first = roles[0].popen.pid
    try:
        assert health_answer(roles[0].command.url, timeout_s=0.3) == SLOW
        assert health_answer(f"http://127.0.0.1:{free_port()}", timeout_s=0.3) is None  # nothing there
        quick = replace(FAST, check_timeout_s=0.2)
        _serve_for(RoleWatch(roles, limits=replace(quick, hung_checks=1000), start_timeout_s=1.5), 1.5)
        assert read_events(tmp_path) == [] and roles[0].popen.pid == first  # 3+ silent checks: still serving
        # on a loaded box a check can take longer than its timeout to come back: wait for the event
        watch = RoleWatch(roles, limits=replace(quick, hung_checks=2), start_timeout_s=1.5)
        _serve_until(watch, tmp_path, "failed")
        failed = [e for e in read_events(tmp_path) if e["event"] == "failed"]
        assert failed and failed[0]["cause"].startswith("decode-0 gave no answer to 2 health checks in a row")
    finally:
        stop_roles(roles, grace_s=1)
        roles.guard.release()


def _wait(predicate, seconds: float) -> bool:  # noqa: ANN001
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_launch_restarts_a_killed_proxy_by_default_and_still_stops_everything_on_sigterm(tmp_path):
    pytest.importorskip("uvicorn", reason="needs the cpu or cuda extra")
    port = free_port()
    launcher = subprocess.Popen([*LAUNCH, "--role", "proxy", "--json", "--base-port", str(port), "--run-dir",
                                 str(tmp_path / "runs"), "--timeout", "60"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        run_dir = Path(json.loads(_read_json(launcher))["run_dir"])
        first = int((run_dir / "proxy.pid").read_text())
        os.kill(first, signal.SIGKILL)
        assert _wait(lambda: any(e["event"] == "serving" for e in read_events(run_dir)), 60), read_events(run_dir)
        assert launcher.poll() is None  # restarted, launch still serving (how fast: benchmarks/chaos.py; a niced,
        # loaded make test took 30.7 s here once, one of them the backoff)
        second = int((run_dir / "proxy.pid").read_text())
        assert second != first and httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
        failed = next(e for e in read_events(run_dir) if e["event"] == "failed")
        assert failed["cause"].startswith("proxy was killed by SIGKILL (log ") and failed["backoff_s"] == 1.0
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=30) == 143
        stderr = launcher.stderr.read()
        assert "failed: proxy was killed by SIGKILL" in stderr and "serving: proxy serving again" in stderr
        assert _wait(lambda: subprocess.run(["ps", "-o", "stat=", "-p", str(second)], capture_output=True,
                                            text=True).stdout.strip() in ("", "Z"), 10)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
        kill_run_groups(tmp_path / "runs")


def test_a_restart_that_fails_to_start_names_vllms_root_cause(tmp_path):
    """The H200 case (2026-12-04): prefill started again but vLLM refused it, the GPU's memory held by its decode
    peer; the restart event says so, from the engine core's error line, not from the log's last lines."""
    from test_start_failure import FAILED_START

    marker, port = tmp_path / "ran", free_port()
    script = (f"import os, sys\nif os.path.exists({str(marker)!r}):\n    sys.stdout.write({FAILED_START!r}); "
              f"sys.exit(1)\nopen({str(marker)!r}, 'w').close()\nsys.argv = ['s', '{port}', '200', '1.5']\n"
              f"exec(compile({SERVER!r}, 'server', 'exec'))\n")
    roles = StartedRoles(tmp_path, Guard())
    roles.start(RoleCommand(name="prefill-0", role=Role.PREFILL, argv=(sys.executable, "-c", script), env=(),
                            host="127.0.0.1", port=port))
    try:
        deadline = time.monotonic() + 30
        while health_answer(roles[0].command.url, timeout_s=0.3) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        watch = RoleWatch(roles, limits=FAST, start_timeout_s=20)
        with pytest.raises(RestartCapSpentError, match="prefill-0 exited with code 1 .*before it was healthy; vLLM: "
                                                       "cuda:0 had 17.98 of 139.8 GiB free"):
            _serve_for(watch, 30)
        causes = [e["cause"] for e in read_events(tmp_path) if e["event"] == "failed"]
        assert causes[0].startswith("prefill-0 exited with code 0")  # the first death: no start failure in it
        assert "vLLM: cuda:0 had 17.98 of 139.8 GiB free, less than this engine's share" in causes[1]
    finally:
        stop_roles(roles, grace_s=1)
        roles.guard.release()
