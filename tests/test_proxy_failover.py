"""The proxy's retries and fallbacks (core/proxy/failover.py) against scripted servers: a hop that failed before
any byte reached the client goes to another server of its role, or to the other role alone; counted in /metrics and
in the timeline; a stream that has begun still ends with the error event."""

from __future__ import annotations

import json

import httpx
import pytest

from test_proxy import D1, D2, KV, P1, P2, PROMPT_IDS, Servers, _client

from hybridserve.core.launch.topology import FirstTokenSource
from hybridserve.core.proxy import failover
from hybridserve.core.proxy.health_watch import EndpointHealth

SOURCES = list(FirstTokenSource)
DROPPED = httpx.RemoteProtocolError("Server disconnected without sending a response")


@pytest.fixture
def events(monkeypatch):
    """The timeline events the proxy emits (core/common/timeline_log.py), as (event, fields)."""
    seen: list[tuple[str, dict]] = []
    monkeypatch.setattr(failover.timeline_log, "emit", lambda event, req, **f: seen.append((event, f)))
    return seen


def _metric(text: str, line: str) -> bool:
    return line in text.splitlines()


def _post(client, body):  # noqa: ANN001
    answer = client.post("/v1/completions", json=body)
    return answer, client.get("/metrics").text


@pytest.mark.parametrize("source", SOURCES)
def test_a_decode_that_refused_the_connection_is_retried_on_the_other_with_the_same_blocks(source, events):
    servers = Servers(fail={"d1": httpx.ConnectError("refused")})
    with _client(servers, decode=(D1, D2), first_token=source) as client:
        answer, metrics = _post(client, {"prompt": "hi", "max_tokens": 8})
    assert answer.status_code == 200
    hosts = [host for host, _, _ in servers.seen]
    assert hosts == ["p1", "d1", "d2"]
    assert servers.seen[2][1]["kv_transfer_params"] == KV  # d1 never saw it: prefill's blocks are untouched
    assert _metric(metrics, 'hybridserve_proxy_retries_total{role="decode"} 1')
    assert _metric(metrics, 'hybridserve_proxy_server_up{role="decode",url="http://d1:1"} 0')
    assert ("retry", {"role": "decode", "failed": D1, "to": D2, "kv_kept": True}) in events


@pytest.mark.parametrize("source", SOURCES)
def test_a_decode_that_died_on_the_request_is_retried_computing_the_prompt_itself(source, events):
    servers = Servers(fail={"d1": DROPPED})
    with _client(servers, decode=(D1, D2), first_token=source) as client:
        answer, metrics = _post(client, {"prompt": "hi", "max_tokens": 8})
    assert answer.status_code == 200 and [h for h, _, _ in servers.seen] == ["p1", "d1", "d2"]
    retried = servers.seen[2][1]
    assert "kv_transfer_params" not in retried  # d1 may have read (and so freed) the blocks
    if source is FirstTokenSource.PREFILL:  # the continuation: prompt + token 1, one token fewer
        assert retried["prompt"] == [*PROMPT_IDS, 7] and retried["max_tokens"] == 7
        assert answer.json()["choices"][0]["text"] == " Aok"
    else:
        assert retried["prompt"] == "hi" and retried["max_tokens"] == 8
    assert ("retry", {"role": "decode", "failed": D1, "to": D2, "kv_kept": False}) in events


@pytest.mark.parametrize("source", SOURCES)
def test_with_no_other_decode_prefill_serves_the_request_alone(source, events):
    servers = Servers(fail={"d1": 500})
    with _client(servers, first_token=source) as client:
        answer, metrics = _post(client, {"prompt": "hi", "max_tokens": 8})
    assert answer.status_code == 200 and [h for h, _, _ in servers.seen] == ["p1", "d1", "p1"]
    alone = servers.seen[2][1]
    assert "kv_transfer_params" not in alone and alone["max_tokens"] == (7 if source is FirstTokenSource.PREFILL
                                                                          else 8)
    assert _metric(metrics, 'hybridserve_proxy_fallbacks_total{served_by="prefill"} 1')
    assert _metric(metrics, 'hybridserve_proxy_requests_total{outcome="ok"} 1')
    assert ("fallback", {"served_by": "prefill", "url": P1}) in events


@pytest.mark.parametrize("source", SOURCES)
def test_a_failed_prefill_is_retried_on_the_other_then_decode_computes_the_prompt_itself(source, events):
    servers = Servers(fail={"p1": 500})
    with _client(servers, prefill=(P1, P2), first_token=source) as client:
        answer, metrics = _post(client, {"prompt": "hi", "max_tokens": 8})
    assert answer.status_code == 200 and [h for h, _, _ in servers.seen] == ["p1", "p2", "d1"]
    assert _metric(metrics, 'hybridserve_proxy_retries_total{role="prefill"} 1')
    servers = Servers(fail={"p1": httpx.ConnectError("refused")})
    with _client(servers, first_token=source) as client:
        answer, metrics = _post(client, {"prompt": "hi", "max_tokens": 8})
    assert answer.status_code == 200 and [h for h, _, _ in servers.seen] == ["p1", "d1"]
    assert servers.seen[1][1] == {"prompt": "hi", "max_tokens": 8}  # the client's own request, nothing added
    assert _metric(metrics, 'hybridserve_proxy_fallbacks_total{served_by="decode"} 1')
    assert ("fallback", {"served_by": "decode", "url": D1}) in events


def test_a_role_known_down_is_routed_around_before_any_hop_and_health_says_so():
    servers = Servers(fail={"d1": httpx.ConnectError("refused")})
    with _client(servers) as client:
        assert client.post("/v1/completions", json={"prompt": "hi"}).status_code == 200  # p1, d1, p1 alone
        health = client.get("/health").json()
        before = len(servers.seen)
        assert client.post("/v1/completions", json={"prompt": "hi"}).status_code == 200
    assert [h for h, _, _ in servers.seen[before:]] == ["p1"]  # no prefill hop, no try of the dead decode
    assert health["status"] == "degraded" and list(health["down"]["decode"]) == [D1]
    assert "ConnectError" in health["down"]["decode"][D1]["why"] and health["down"]["prefill"] == {}


def test_a_client_error_and_a_timeout_are_not_retried():
    for fail, status in (({"d1": 400}, 400), ({"d1": httpx.ReadTimeout("slow")}, 504)):
        servers = Servers(fail=fail)
        with _client(servers, decode=(D1, D2)) as client:
            answer, metrics = _post(client, {"prompt": "hi"})
        assert answer.status_code == status and [h for h, _, _ in servers.seen] == ["p1", "d1"]
        assert "retries_total{" not in metrics and "fallbacks_total{" not in metrics


def test_a_request_gives_up_after_three_failures_naming_them():
    servers = Servers(fail={"d1": 500, "d2": 500, "p1": [None, 500], "p2": 500})
    with _client(servers, prefill=(P1, P2), decode=(D1, D2)) as client:
        answer = client.post("/v1/completions", json={"prompt": "hi"})
    assert answer.status_code == 502 and len(servers.seen) == 4  # p1's hop, d1, d2, then prefill alone once
    message = answer.json()["error"]["message"]
    assert message.count("failed: HTTP 500") == 3 and "before it: decode server http://d1:1" in message


def test_token_1_out_then_decode_refused_the_stream_continues_on_the_other_decode(events):
    chunks = [b'data: {"choices":[{"text":"ok","finish_reason":"length"}]}\n\n', b"data: [DONE]\n\n"]
    servers = Servers(fail={"d1": DROPPED}, stream_chunks=chunks)
    with _client(servers, decode=(D1, D2), first_token=FirstTokenSource.PREFILL) as client:
        reply = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 8, "stream": True})
        metrics = client.get("/metrics").text
    events_out = [e for e in reply.text.split("\n\n") if e]
    assert json.loads(events_out[0].removeprefix("data: "))["choices"][0]["text"] == " A"
    assert events_out[-1] == "data: [DONE]" and "error" not in reply.text
    assert servers.seen[2][0] == "d2" and "kv_transfer_params" not in servers.seen[2][1]
    assert _metric(metrics, 'hybridserve_proxy_requests_total{outcome="ok"} 1')


def test_a_stream_that_has_begun_is_not_retried_and_ends_with_the_error_event():
    chunks = [b'data: {"choices":[{"text":"a"}]}\n\n', DROPPED]
    servers = Servers(stream_chunks=chunks)
    with _client(servers, decode=(D1, D2)) as client:
        text = client.post("/v1/completions", json={"prompt": "hi", "stream": True}).text
        metrics = client.get("/metrics").text
    error = json.loads(text.split("\n\n")[-2].removeprefix("data: "))["error"]
    assert error["role"] == "decode" and "stream broken" in error["message"]
    assert [h for h, _, _ in servers.seen] == ["p1", "d1"] and "retries_total{" not in metrics


@pytest.mark.parametrize("source", SOURCES)
def test_a_connection_broken_mid_request_does_not_mark_the_server_down(source, events):
    """A keep-alive reset after a stall (core/common/keepalive.py) breaks one pooled connection of a server that still
    listens: the next request goes there again (a refused connection marks it down: the first test above)."""
    servers = Servers(fail={"d1": [httpx.ReadError("reset"), None]})
    with _client(servers, first_token=source) as client:
        first, _ = _post(client, {"prompt": "hi", "max_tokens": 8})
        second, metrics = _post(client, {"prompt": "hi", "max_tokens": 8})
    assert first.status_code == second.status_code == 200
    assert [h for h, _, _ in servers.seen] == ["p1", "d1", "p1", "p1", "d1"]  # prefill alone, then d1 again
    assert _metric(metrics, 'hybridserve_proxy_server_up{role="decode",url="http://d1:1"} 1')


def test_a_hop_marks_a_server_down_for_a_while_and_a_probe_for_good(monkeypatch):
    health = EndpointHealth((D1,))
    clock = [1000.0]
    monkeypatch.setattr("hybridserve.core.proxy.health_watch.time.time", lambda: clock[0])
    health.mark_down(D1, "ConnectError")
    assert not health.is_up(D1)
    clock[0] += 6  # past HOP_DOWN_S: tried again
    assert health.is_up(D1)
    health.mark_down(D1, "/health: HTTP 503", is_probe=True)
    clock[0] += 600
    assert not health.is_up(D1) and health.report()[D1]["down_s"] == 600


def test_a_probe_marks_a_503_or_a_refusing_server_down_keeps_a_slow_one_and_a_200_up():
    import asyncio

    answers = {"d1": 503, "d2": httpx.ConnectError("refused"), "p1": 200, "p2": httpx.ReadTimeout("busy")}

    def backend(request: httpx.Request) -> httpx.Response:
        answer = answers[request.url.host]
        if isinstance(answer, Exception):
            raise answer
        return httpx.Response(answer)

    async def probe(health: EndpointHealth) -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(backend)) as client:
            await health.probe(client)

    health = EndpointHealth((D1, D2, P1, P2))
    asyncio.run(probe(health))
    assert {url: health.is_up(url) for url in health.urls} == {D1: False, D2: False, P1: True, P2: True}
    asyncio.run(probe(health)), asyncio.run(probe(health))
    assert health.is_up(P2) and health.slow[P2] == 3  # slow 3 times: busy, not dead (it still serves)
    assert health.report()[D1]["why"] == "/health: HTTP 503" and health.report()[D2]["why"] == "/health: ConnectError"
    answers["d1"] = 200
    asyncio.run(probe(health))
    assert health.is_up(D1) and not health.is_up(D2)


def test_a_server_that_stops_answering_is_seen_down_while_its_peers_probe_waits():
    """Each server is probed on its own clock: a peer whose /health takes the whole probe timeout does not delay
    seeing a killed server."""
    import asyncio

    from hybridserve.core.proxy import health_watch

    refused_at: list[float] = []

    async def backend(request: httpx.Request) -> httpx.Response:
        if request.url.host == "d2":  # busy: answers only after the probe timeout
            await asyncio.sleep(health_watch.PROBE_TIMEOUT_S + 1)
            return httpx.Response(200)
        if refused_at:
            raise httpx.ConnectError("refused")
        return httpx.Response(200)

    async def scenario(health: EndpointHealth) -> float:
        async with httpx.AsyncClient(transport=httpx.MockTransport(backend)) as client:
            task = asyncio.create_task(health.probe_forever(client, 0.2))
            await asyncio.sleep(0.5)
            assert health.is_up(D1)
            refused_at.append(asyncio.get_running_loop().time())  # d1 dies now
            while health.is_up(D1):
                await asyncio.sleep(0.02)
            seen = asyncio.get_running_loop().time() - refused_at[0]
            task.cancel()
            return seen

    health = EndpointHealth((D1, D2))
    seen = asyncio.run(scenario(health))
    assert seen < 1.0, seen  # one interval and a probe; a shared round would wait for d2's 2 s timeout first
    assert health.is_up(D2)  # slow is not down


def test_a_broken_hop_probes_its_server_now_a_dead_one_is_down_a_stalled_one_stays_up():
    """Route.failed on a broken connection asks for a probe at once (the regular one is an interval away): d1 died and
    refuses; d2's API server is stalled (a keep-alive reset, not a death) and stays up."""
    import asyncio

    from hybridserve.core.proxy.hops import HopError
    from hybridserve.core.proxy.prometheus import ProxyMetrics
    from hybridserve.core.proxy.routing import EndpointPool

    probed: list[str] = []

    async def backend(request: httpx.Request) -> httpx.Response:
        probed.append(request.url.host)
        if len(probed) <= 2:  # probe_forever's first round: both up
            return httpx.Response(200)
        if request.url.host == "d2":  # stalled a while (MockTransport has no timeouts), then answers
            await asyncio.sleep(1.0)
            return httpx.Response(200)
        raise httpx.ConnectError("refused")

    async def scenario(pool: EndpointPool) -> tuple[bool, bool, float]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(backend)) as client:
            task = asyncio.create_task(pool.health.probe_forever(client, 600))  # no second regular round
            await asyncio.sleep(0.1)
            began = asyncio.get_running_loop().time()
            for rid, url in enumerate((D1, D2, D2)):  # d2 twice: one probe in flight is enough
                Route(f"r{rid}", None, pool, ProxyMetrics()).failed(
                    HopError("decode", url, 502, "ReadError: reset", is_transport=True))
            while pool.health.is_up(D1) and asyncio.get_running_loop().time() - began < 0.9:
                await asyncio.sleep(0.01)
            seen = asyncio.get_running_loop().time() - began
            await asyncio.sleep(1.2)
            task.cancel()
            return pool.health.is_up(D1), pool.health.is_up(D2), seen

    from hybridserve.core.launch.topology import RoutingPolicy
    from hybridserve.core.proxy.failover import Route

    pool = EndpointPool("decode", (D1, D2), RoutingPolicy.ROUND_ROBIN)
    d1_up, d2_up, seen = asyncio.run(scenario(pool))
    assert not d1_up and d2_up and seen < 0.5, (seen, probed)
    assert probed.count("d2") == 2  # the round, then one probe now (the second broken hop found it in flight)


def test_the_timeline_join_counts_retries_and_fallbacks_as_proxy_events():
    from hybridserve.core.chaos.timeline_gaps import per_request

    rid = "ab" * 16
    events = [{"t": 1.0, "pid": 1, "event": "hop1_start", "req": rid},
              {"t": 1.2, "pid": 1, "event": "retry", "req": rid, "role": "decode"},
              {"t": 1.3, "pid": 1, "event": "fallback", "req": rid, "served_by": "prefill"}]
    assert set(per_request(events)[rid]) == {"proxy:hop1_start", "proxy:retry", "proxy:fallback"}


def test_a_prefill_hop_counts_as_outstanding_while_it_runs():
    import asyncio

    from hybridserve.core.launch.topology import RoutingPolicy
    from hybridserve.core.proxy.prometheus import ProxyMetrics
    from hybridserve.core.proxy.routing import EndpointPool

    prefill = EndpointPool("prefill", (P1, P2), RoutingPolicy.LEAST_OUTSTANDING)
    route = failover.Route("r", prefill, EndpointPool("decode", (D1,), RoutingPolicy.ROUND_ROBIN), ProxyMetrics())
    during = []

    async def hop(url: str) -> str:
        during.append(dict(prefill.outstanding))
        return "kv"

    assert asyncio.run(failover.prefill_step(route, hop)) == (P1, "kv")
    assert during == [{P1: 1, P2: 0}] and prefill.outstanding == {P1: 0, P2: 0}


def test_a_detokenize_on_a_decode_that_died_after_its_answer_goes_to_another_server():
    """Token 1 is part of a character (prefill's text for it is empty): the text comes from /detokenize, which the
    decode server that answered can no longer give; prefill has the same tokenizer."""
    from test_proxy import prefill_answer

    class Detokenizing(Servers):
        async def __call__(self, request):
            if request.url.path == "/detokenize":
                self.seen.append((request.url.host, json.loads(request.content), None))
                if request.url.host == "d1":
                    raise httpx.ConnectError("refused")
                alone = len(json.loads(request.content)["tokens"]) == 1  # token 1 alone: half a character
                return httpx.Response(200, json={"prompt": "\ufffd" if alone else "\u00e9!"})
            return await super().__call__(request)

    answer = prefill_answer()
    answer["choices"][0]["text"] = ""
    servers = Detokenizing(prefill_answer=answer)
    with _client(servers, first_token=FirstTokenSource.PREFILL) as client:
        reply = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3})
    assert reply.status_code == 200 and reply.json()["choices"][0]["text"] == "\u00e9!"
    # hop 1, prefill's /detokenize of token 1 alone (half a character, not a hidden token), hop 2, the text
    # repair's /detokenize: refused by the dead decode, answered by prefill
    assert [h for h, _, _ in servers.seen] == ["p1", "p1", "d1", "d1", "p1"]
