"""The OpenAI-compatible P/D proxy: FastAPI in front of prefill and decode vLLM servers (or, for aggregated serving,
of replicas: each request whole to one of them, core/launch/replicas.py), httpx behind.

Routes: POST /v1/completions and /v1/chat/completions (streaming too), GET /v1/models, /health, /metrics. With a
front key every route but /health and /metrics asks for it (auth.py).
Each generation request goes to a prefill server (max_tokens=1, do_remote_decode) and then to a decode server
with the kv_transfer_params that came back; both hops carry the same X-Request-Id. With `first_token` prefill (the
default) a plain completion gets its first token from the prefill hop (first_token.py); otherwise, and for chat,
decode samples it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from hybridserve.core.common import keepalive, kv_lease, timeline_log
from hybridserve.core.common.contracts import REQUEST_ID_HEADER
from hybridserve.core.launch.topology import FirstTokenSource
from hybridserve.core.proxy import eligibility, failover, first_token, hops, relay
from hybridserve.core.proxy.auth import BearerGuard
from hybridserve.core.proxy.config import ProxyConfig
from hybridserve.core.proxy.health_watch import EndpointHealth
from hybridserve.core.proxy.prometheus import ProxyMetrics
from hybridserve.core.proxy.routing import EndpointPool
from hybridserve.core.proxy.stopping import Stopping


def create_app(config: ProxyConfig, *, transport: httpx.AsyncBaseTransport | None = None) -> FastAPI:
    """`transport` replaces the network for tests (httpx.MockTransport); None: real connections."""
    def pool(role: str, urls: tuple[str, ...]) -> EndpointPool:
        return EndpointPool(role, urls, config.policy, EndpointHealth(urls, warm_file=config.warm_file))

    if config.replica_urls:  # aggregated serving: one pool, each request whole to one replica
        prefill_pool = decode_pool = None
        replica_pool = pool("replica", config.replica_urls)
        pools = {"replica": replica_pool}
    else:
        prefill_pool = pool("prefill", config.prefill_urls)
        decode_pool = pool("decode", config.decode_urls)
        replica_pool, pools = None, {"prefill": prefill_pool, "decode": decode_pool}
    metrics = ProxyMetrics()
    stopping = Stopping()  # set by server.py as the proxy begins to stop: the streams it relays end then
    model_lens: dict[str, int | None] = {}  # decode's max_model_len, asked once (first_token.fits)
    if timeline_log.path_from_env() is not None:  # HYBRIDSERVE_TIMELINE_FILE: the hop events of each request
        timeline_log.open_file(timeline_log.path_from_env())

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):  # noqa: ANN202
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64,
                              keepalive_expiry=keepalive.IDLE_EXPIRY_S)
        # every call to an engine (hops, /v1/models, /detokenize, /health probes) carries the engine key, never the
        # client's
        headers = {"Authorization": f"Bearer {config.engine_key}"} if config.engine_key else None
        async with httpx.AsyncClient(timeout=httpx.Timeout(config.timeout_s), limits=limits, headers=headers,
                                     transport=transport) as client:
            app.state.client = client
            probes = [asyncio.create_task(pool.health.probe_forever(client, config.health_interval_s))
                      for pool in pools.values() if config.health_interval_s]
            try:
                yield
            finally:
                for task in probes:
                    task.cancel()

    app = FastAPI(title="hybridserve P/D proxy", lifespan=lifespan)
    app.state.stopping = stopping
    if config.api_key is not None:  # the front door: every path but /health and /metrics (auth.py)
        app.add_middleware(BearerGuard, key=config.api_key,
                           on_refused=lambda: metrics.requests.update(unauthorized=1))

    async def generate(request: Request, path: str) -> Any:
        try:
            body = await request.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            metrics.requests["bad_request"] += 1
            return JSONResponse({"error": {"message": "request body must be a JSON object", "code": 400}}, 400)
        headers = {REQUEST_ID_HEADER: request.headers.get(REQUEST_ID_HEADER) or uuid.uuid4().hex}
        client: httpx.AsyncClient = request.app.state.client
        rid = headers[REQUEST_ID_HEADER]
        route = failover.Route(rid, prefill_pool, decode_pool, metrics, replica=replica_pool, stopping=stopping)
        send = _sender(client, route, metrics, path, headers, is_stream=bool(body.get("stream")))
        if replica_pool is not None:
            return await _via_replica(route, send, body, metrics, rid)
        if config.first_token is FirstTokenSource.PREFILL:
            way = eligibility.route(path, body)
            metrics.observe_route(way)
            if way.is_first_token:
                return await _via_prefill_token(client, route, send, path, body, headers, metrics, model_lens)
        try:
            if not route.has_up("decode"):  # no decode server up: prefill alone, no hop to try first
                return _answer(route, metrics, await route.alone("prefill", send, body), rid)
            timeline_log.emit("hop1_start", rid)
            got = await failover.prefill_step(route, lambda url: _timed(
                metrics, "prefill", hops.prefill(client, url, path, body, headers)))
            timeline_log.emit("hop1_end", rid)
            if got is None:  # no prefill server left: decode computes the prompt itself
                return _answer(route, metrics, await route.alone("decode", send, body), rid)
            timeline_log.emit("hop2_start", rid)
            served = await failover.decode_step(route, send, hops.decode_body(body, got[1]))
        except hops.HopError as err:
            metrics.requests[err.outcome] += 1
            return JSONResponse(err.body(), status_code=err.status)
        return _answer(route, metrics, served, rid)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        return await generate(request, "/v1/completions")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        return await generate(request, "/v1/chat/completions")

    @app.get("/v1/models")
    async def models(request: Request) -> Any:
        role, pool = ("replica", replica_pool) if replica_pool is not None else ("decode", decode_pool)
        url = pool.pick()
        try:
            response = await request.app.state.client.get(f"{url}/v1/models")
            return JSONResponse(response.json(), status_code=response.status_code)
        except (httpx.HTTPError, ValueError) as exc:
            err = hops.HopError(role, url, 502, f"{type(exc).__name__}: {exc}")
            return JSONResponse(err.body(), status_code=502)

    @app.get("/health")
    async def health() -> Any:
        """200 while the proxy runs, even with a role down (it routes around it: failover.py); `down` names the
        servers its probes or hops found down (a role being restarted by launch), `status` is then "degraded"."""
        down = {role: pool.health.report() for role, pool in pools.items()}
        status = "degraded" if any(down.values()) else "ok"
        if replica_pool is not None:  # no P/D split: nobody samples a first token apart
            return {"status": status, "replica": list(config.replica_urls), "down": down}
        return {"status": status, "prefill": list(config.prefill_urls), "decode": list(config.decode_urls),
                "down": down, "first_token": config.first_token.value}

    @app.get("/metrics")
    async def prometheus() -> Any:
        outstanding = {role: pool.outstanding for role, pool in pools.items()}
        up = {role: {url: pool.health.is_up(url) for url in pool.urls} for role, pool in pools.items()}
        return PlainTextResponse(metrics.render(outstanding, up))

    return app


async def _timed(metrics: ProxyMetrics, hop: str, awaitable: Any) -> Any:
    start = time.perf_counter()
    try:
        return await awaitable
    finally:
        metrics.observe_hop(hop, time.perf_counter() - start)


def _sender(client: httpx.AsyncClient, route: failover.Route, metrics: ProxyMetrics, path: str, headers: dict, *,
            is_stream: bool) -> failover.Send:
    """How a hop after prefill's reaches a server: its JSON answer, or (a stream) its opened response, which holds
    the server as outstanding until the relay ends (relay.py)."""
    async def send(role: str, url: str, body: dict) -> Any:
        pool = route.pools[role]
        if not is_stream:
            with pool.held(url):
                answer = await _timed(metrics, role, hops.post_json(client, role, url, path, body, headers))
            if kv_lease.is_refused(answer):  # decode's lease guard computed the prompt itself
                metrics.lease["refused"] += 1
            return answer
        pool.outstanding[url] += 1
        try:
            return await relay.open_stream(client, role, url, path, body, headers)
        except hops.HopError:
            pool.outstanding[url] -= 1
            raise
    return send


async def _via_replica(route: failover.Route, send: failover.Send, body: dict, metrics: ProxyMetrics,
                       rid: str) -> Any:
    """Aggregated serving: the request whole on one replica, the next one up after a retryable failure."""
    try:
        served = await route.serve("replica", send, body)
    except hops.HopError as err:
        metrics.requests[err.outcome] += 1
        return JSONResponse(err.body(), status_code=err.status)
    return _answer(route, metrics, served, rid)


def _answer(route: failover.Route, metrics: ProxyMetrics, served: failover.Served, rid: str) -> Any:
    """A served request to the client: a JSON answer as it came, or the stream relayed."""
    role, url, answer = served
    if isinstance(answer, httpx.Response):
        return StreamingResponse(relay.relay(route, metrics, rid, served), media_type="text/event-stream")
    metrics.requests["ok"] += 1
    return JSONResponse(answer)


async def _via_prefill_token(client: httpx.AsyncClient, route: failover.Route, send: failover.Send, path: str,
                             body: dict, headers: dict, metrics: ProxyMetrics, cache: dict) -> Any:
    """Prefill computes the whole prompt and samples token 1; decode continues from it (first_token.py)."""
    rid = headers[REQUEST_ID_HEADER]
    try:
        if not route.has_up("decode"):
            return _answer(route, metrics, await route.alone("prefill", send, body), rid)
        timeline_log.emit("hop1_start", rid)
        got = await failover.prefill_step(route, lambda url: _timed(
            metrics, "prefill", _prefill_first(client, url, path, body, headers)))
        timeline_log.emit("hop1_end", rid)
        if got is None:
            return _answer(route, metrics, await route.alone("decode", send, body), rid)
        first = got[1]
        if first.is_last:
            metrics.requests["ok"] += 1
            if body.get("stream"):
                return StreamingResponse(relay.replay(first_token.first_events(first, body)),
                                         media_type="text/event-stream")
            return JSONResponse(first_token.client_answer(first, body))
        decode = first_token.decode_body(body, first)
        if body.get("stream"):
            room = await _max_model_len(client, route.pools["decode"], cache)
            is_early = first_token.fits(first, body, room)
            timeline_log.emit("hop2_start", rid)
            step = lambda: failover.decode_step(route, send, decode)  # noqa: E731
            served = None if is_early else await step()
            return StreamingResponse(relay.relay(route, metrics, rid, served, step=step, client=client, first=first,
                                            head=first_token.first_events(first, body), client_body=body),
                                     media_type="text/event-stream")
        timeline_log.emit("hop2_start", rid)
        role, url, answer = await failover.decode_step(route, send, decode)
        text = None
        if not first.is_text_whole:
            ids = [*first.token_ids, *(answer["choices"][0].get("token_ids") or [])]
            text = (await relay.detokenizer(client, route.servers_up(role, url), body)(ids)).rstrip("\ufffd")
    except hops.HopError as err:
        metrics.requests[err.outcome] += 1
        return JSONResponse(err.body(), status_code=err.status)
    metrics.requests["ok"] += 1
    return JSONResponse(first_token.merge_answer(first, answer, body, text))


async def _max_model_len(client: httpx.AsyncClient, pool: EndpointPool, cache: dict) -> int | None:
    """The decode servers' max_model_len from the first one's /v1/models (launch gives every engine the same);
    None when it does not say. Asked once."""
    url = pool.urls[0]
    if url not in cache:
        try:
            answer = (await client.get(f"{url}/v1/models")).json()
            value = answer["data"][0].get("max_model_len")
            cache[url] = value if isinstance(value, int) else None
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError, AttributeError):
            return None  # asked again next time
    return cache[url]


async def _prefill_first(client: httpx.AsyncClient, url: str, path: str, body: dict,
                         headers: dict) -> first_token.FirstToken:
    sent = first_token.prefill_body(body)
    answer = await hops.post_json(client, "prefill", url, path, sent, headers)
    first = first_token.FirstToken.parse(url, sent, answer)
    return await first_token.with_hidden_text(first, relay.detokenizer(client, [("prefill", url)], body))
