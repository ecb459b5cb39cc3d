"""The P/D proxy against scripted prefill/decode servers (httpx.MockTransport): protocol, errors, routing."""

from __future__ import annotations

import json

import httpx
import pytest
from fastapi.testclient import TestClient

from hybridserve.core.proxy.app import create_app
from hybridserve.core.proxy.config import ProxyConfig
from hybridserve.core.proxy.routing import EndpointPool
from hybridserve.core.launch.topology import RoutingPolicy

P1, P2, D1, D2 = "http://p1:1", "http://p2:1", "http://d1:1", "http://d2:1"
KV = {"do_remote_prefill": True, "remote_engine_id": "e", "remote_block_ids": [[1], [2], [3], [4]]}


class Servers:
    """Scripted backends; records every request; `fail` maps a host to an exception or a status code."""

    def __init__(self, *, fail=None, stream_chunks=None, prefill_answer=None):
        self.seen: list[tuple[str, dict, str]] = []
        self.fail = fail or {}
        self.stream_chunks = stream_chunks
        self.prefill_answer = prefill_answer if prefill_answer is not None else {"kv_transfer_params": KV}

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        body = json.loads(request.content) if request.content else {}
        self.seen.append((host, body, request.headers.get("x-request-id")))
        failure = self.fail.get(host)
        if isinstance(failure, Exception):
            raise failure
        if isinstance(failure, int):
            return httpx.Response(failure, text="Internal server error")
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "tiny"}]})
        if host.startswith("p"):
            return httpx.Response(200, json=self.prefill_answer)
        if body.get("stream"):
            return httpx.Response(200, stream=_Stream(self.stream_chunks))
        return httpx.Response(200, json={"choices": [{"text": "ok"}], "served_by": host})


class _Stream(httpx.AsyncByteStream):
    def __init__(self, chunks):
        self.chunks = chunks

    async def __aiter__(self):
        for chunk in self.chunks:
            if isinstance(chunk, Exception):
                raise chunk
            yield chunk


def _client(servers: Servers, *, prefill=(P1,), decode=(D1,), policy=RoutingPolicy.ROUND_ROBIN) -> TestClient:
    config = ProxyConfig(prefill_urls=prefill, decode_urls=decode, policy=policy, timeout_s=5.0)
    return TestClient(create_app(config, transport=httpx.MockTransport(servers)))


def test_two_hops_carry_the_protocol():
    servers = Servers()
    with _client(servers) as client:
        answer = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 16, "min_tokens": 4,
                                                      "stream_options": {"include_usage": True}})
    assert answer.status_code == 200 and answer.json()["served_by"] == "d1"
    (p_host, p_body, p_id), (d_host, d_body, d_id) = servers.seen
    assert (p_host, d_host) == ("p1", "d1")
    assert p_body["max_tokens"] == 1 and p_body["stream"] is False
    assert p_body["kv_transfer_params"]["do_remote_decode"] is True
    assert "min_tokens" not in p_body and "stream_options" not in p_body
    assert d_body["max_tokens"] == 16 and d_body["kv_transfer_params"] == KV and d_body["min_tokens"] == 4
    assert p_id == d_id and p_id  # one X-Request-Id on both hops


def test_chat_completion_caps_max_completion_tokens_on_prefill():
    servers = Servers()
    with _client(servers) as client:
        answer = client.post("/v1/chat/completions", json={"messages": [], "max_completion_tokens": 9})
    assert answer.status_code == 200
    assert servers.seen[0][1]["max_completion_tokens"] == 1 and servers.seen[1][1]["max_completion_tokens"] == 9


@pytest.mark.parametrize("fail,status,role,reason", [
    ({"p1": httpx.ConnectError("refused")}, 502, "prefill", "ConnectError"),
    ({"p1": httpx.ReadTimeout("slow")}, 504, "prefill", "no answer within the timeout"),
    ({"p1": 500}, 502, "prefill", "HTTP 500"),
    ({"d1": httpx.RemoteProtocolError("Server disconnected")}, 502, "decode", "Server disconnected"),
    ({"d1": 500}, 502, "decode", "HTTP 500: Internal server error"),
], ids=["prefill-down", "prefill-timeout", "prefill-500", "decode-dropped", "decode-500"])
def test_a_failing_server_is_named(fail, status, role, reason):
    with _client(Servers(fail=fail)) as client:
        answer = client.post("/v1/completions", json={"prompt": "hi"})
        metrics = client.get("/metrics").text
    assert answer.status_code == status
    error = answer.json()["error"]
    assert error["role"] == role and reason in error["message"] and f"{role} server http://" in error["message"]
    assert f'hybridserve_proxy_requests_total{{outcome="{role}_error"}} 1' in metrics


@pytest.mark.parametrize("fail,role,stream", [
    ({"p1": 400}, "prefill", False), ({"d1": 400}, "decode", False), ({"d1": 422}, "decode", True),
], ids=["prefill-400", "decode-400", "decode-stream-422"])
def test_a_role_refusing_the_request_passes_its_4xx_on(fail, role, stream):
    """A prompt over max_model_len makes vLLM answer 400: the client's mistake, not a server failure (no 502)."""
    with _client(Servers(fail=fail)) as client:
        answer = client.post("/v1/completions", json={"prompt": "hi", "stream": stream})
        metrics = client.get("/metrics").text
    status = next(iter(fail.values()))
    assert answer.status_code == status
    error = answer.json()["error"]
    assert error["role"] == role and error["code"] == status and error["type"] == "invalid_request_error"
    assert f"{role} server http://" in error["message"] and f"refused the request: HTTP {status}" in error["message"]
    assert 'outcome="client_error"} 1' in metrics and "_error\"} 1" not in metrics.replace("client_error", "")


def test_a_stream_the_client_abandons_is_counted_as_cancelled():
    """Drive the ASGI app directly (uvicorn's ASGI 2.3 scope): the client disconnects after the first event."""
    import asyncio

    async def scenario() -> str:
        first_sent, release = asyncio.Event(), asyncio.Event()

        class Hanging(httpx.AsyncByteStream):
            async def __aiter__(self):
                yield b'data: {"choices":[{"text":"a"}]}\n\n'
                await release.wait()  # decode keeps generating; the client is gone by then
                yield b"data: [DONE]\n\n"

        def backend(request: httpx.Request) -> httpx.Response:
            if request.url.host == "p1":
                return httpx.Response(200, json={"kv_transfer_params": KV})
            return httpx.Response(200, stream=Hanging())

        config = ProxyConfig(prefill_urls=(P1,), decode_urls=(D1,), timeout_s=5.0)
        app = create_app(config, transport=httpx.MockTransport(backend))
        body = json.dumps({"prompt": "hi", "stream": True}).encode()
        messages = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive():
            if messages:
                return messages.pop()
            await first_sent.wait()
            return {"type": "http.disconnect"}

        async def send(message):
            if message["type"] == "http.response.body" and message.get("body"):
                first_sent.set()

        scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
                 "method": "POST", "scheme": "http", "path": "/v1/completions", "raw_path": b"/v1/completions",
                 "query_string": b"", "root_path": "", "headers": [(b"content-type", b"application/json")],
                 "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8000), "app": app}
        async with app.router.lifespan_context(app):
            await asyncio.wait_for(app(scope, receive, send), timeout=10)
            release.set()
            metrics = {**scope, "method": "GET", "path": "/metrics", "raw_path": b"/metrics"}
            chunks = []

            async def collect(message):
                chunks.append(message.get("body", b""))

            await app(metrics, receive, collect)
        return b"".join(chunks).decode()

    metrics = asyncio.run(scenario())
    assert 'outcome="cancelled"} 1' in metrics and 'outcome="ok"' not in metrics
    assert 'hybridserve_proxy_outstanding{role="decode",url="http://d1:1"} 0' in metrics


def test_prefill_without_kv_params_is_refused():
    with _client(Servers(prefill_answer={"choices": []})) as client:
        answer = client.post("/v1/completions", json={"prompt": "hi"})
    assert answer.status_code == 502 and "no kv_transfer_params" in answer.json()["error"]["message"]


def test_stream_is_relayed_with_done():
    chunks = [b'data: {"choices":[{"text":"a"}]}\n\n', b"data: [DONE]\n\n"]
    with _client(Servers(stream_chunks=chunks)) as client:
        text = client.post("/v1/completions", json={"prompt": "hi", "stream": True}).text
    assert text == b"".join(chunks).decode()


@pytest.mark.parametrize("chunks,reason", [
    ([b'data: {"choices":[{"text":"a"}]}\n\n'], "stream ended without [DONE]"),
    ([b'data: {"choices":[{"text":"a"}]}\n\n', httpx.ReadError("peer closed")], "stream broken (ReadError"),
    ([b'data: {"choices":[{"text":"a"}]}\n\n', httpx.ReadTimeout("slow")], "no data within the timeout"),
], ids=["no-done", "broken", "stalled"])
def test_a_stream_that_stops_early_ends_with_an_error_event(chunks, reason):
    with _client(Servers(stream_chunks=chunks)) as client:
        text = client.post("/v1/completions", json={"prompt": "hi", "stream": True}).text
        metrics = client.get("/metrics").text
    events = [e for e in text.split("\n\n") if e]
    assert events[0] == 'data: {"choices":[{"text":"a"}]}'
    error = json.loads(events[-1].removeprefix("data: "))["error"]
    assert error["role"] == "decode" and reason in error["message"] and "[DONE]" not in events[-1].split("message")[0]
    assert 'outcome="decode_error"} 1' in metrics


def test_bad_body_is_400():
    with _client(Servers()) as client:
        answer = client.post("/v1/completions", content=b"[1, 2]", headers={"content-type": "application/json"})
    assert answer.status_code == 400


def test_round_robin_spreads_both_hops():
    servers = Servers()
    with _client(servers, prefill=(P1, P2), decode=(D1, D2)) as client:
        for _ in range(4):
            assert client.post("/v1/completions", json={"prompt": "hi"}).status_code == 200
    hosts = [host for host, _, _ in servers.seen]
    assert hosts == ["p1", "d1", "p2", "d2", "p1", "d1", "p2", "d2"]


def test_least_outstanding_picks_the_idle_server():
    pool = EndpointPool("decode", (D1, D2), RoutingPolicy.LEAST_OUTSTANDING)
    with pool.use() as first:
        assert first == D1 and pool.outstanding == {D1: 1, D2: 0}
        with pool.use() as second:
            assert second == D2
            with pool.use() as third:
                assert third == D1  # tie 1:1 goes to the first listed
    assert pool.outstanding == {D1: 0, D2: 0}
    with pool.use() as again:
        assert again == D1


def test_models_health_and_metrics():
    with _client(Servers()) as client:
        assert client.get("/v1/models").json()["data"][0]["id"] == "tiny"
        assert client.get("/health").json()["decode"] == [D1]
        client.post("/v1/completions", json={"prompt": "hi"})
        metrics = client.get("/metrics").text
    assert 'hybridserve_proxy_requests_total{outcome="ok"} 1' in metrics
    assert 'hybridserve_proxy_hop_seconds_count{hop="prefill"} 1' in metrics
    assert 'hybridserve_proxy_outstanding{role="decode",url="http://d1:1"} 0' in metrics
