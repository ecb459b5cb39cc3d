"""The clients drop an idle connection well before a uvicorn server closes it, and the servers keep one through a
stall of their own (core/common/keepalive.py)."""

import inspect
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest
import uvicorn

from hybridserve.core.common import keepalive
from hybridserve.core.launch.engine_command import engine_env
from hybridserve.core.launch.topology import local_topology

SERVER = """
import sys, uvicorn
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), timeout_keep_alive=int(sys.argv[2]), log_level="error")
"""


def test_idle_expiry_is_below_the_server_keepalive_of_vllm_and_of_the_proxy():
    vllm_envs = pytest.importorskip("vllm.envs")
    server_timeouts = {
        "vLLM API server (VLLM_HTTP_TIMEOUT_KEEP_ALIVE)": vllm_envs.VLLM_HTTP_TIMEOUT_KEEP_ALIVE,
        "uvicorn default (the proxy)": inspect.signature(uvicorn.Config).parameters["timeout_keep_alive"].default,
    }
    for server, timeout_s in server_timeouts.items():
        assert timeout_s - keepalive.IDLE_EXPIRY_S >= 2.0, (server, timeout_s)


def test_launch_gives_every_engine_a_keepalive_past_the_proxys_hop_timeout():
    topology = local_topology(base_port=40000)
    for instance, role in ((topology.prefill[0], "prefill"), (topology.decode[0], "decode")):
        env = dict(engine_env(topology, instance, role=role))
        assert int(env["VLLM_HTTP_TIMEOUT_KEEP_ALIVE"]) == 125 > topology.proxy.timeout_s  # 120 s + 5


def _wait_parked(pid: int, timeout_s: float = 5.0) -> None:
    """Until the server's event loop waits in epoll, so its keep-alive timer is armed before the stop. A loaded CI
    run got "ok": most likely the server was stopped between its response and that timer, armed it on waking and
    read the request."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/wchan") as wchan:
            if "epoll" in wchan.read():
                return
        time.sleep(0.02)


def _stalled_request(keepalive_s: int, stall_s: float) -> str:
    """A request sent on a connection idle 0.5 s or more (until the server is parked) to a server SIGSTOPped for
    `stall_s`: what the client got."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port), str(keepalive_s)])
    try:
        # the pooled connection is kept however long the server takes to park: the stall meets the request on it
        with httpx.Client(timeout=30, limits=httpx.Limits(keepalive_expiry=60)) as client:
            for _ in range(100):
                try:
                    client.post(f"http://127.0.0.1:{port}/")
                    break
                except httpx.ConnectError:
                    time.sleep(0.1)
            time.sleep(0.5)
            _wait_parked(server.pid)
            os.kill(server.pid, signal.SIGSTOP)
            threading.Timer(stall_s, os.kill, (server.pid, signal.SIGCONT)).start()
            try:
                return client.post(f"http://127.0.0.1:{port}/").text
            except httpx.HTTPError as exc:
                return type(exc).__name__
    finally:
        server.kill()
        server.wait()


def test_a_server_stalled_past_its_keepalive_resets_the_request_waiting_in_its_socket_and_a_longer_one_reads_it():
    """issue 39's ReadError on a pooled connection after decode's SIGSTOP, reproduced with a bare uvicorn server:
    on waking, its overdue keep-alive timer closes the connection before the request is read."""
    assert _stalled_request(keepalive_s=2, stall_s=3.0) in ("ReadError", "RemoteProtocolError")
    assert _stalled_request(keepalive_s=30, stall_s=3.0) == "ok"
