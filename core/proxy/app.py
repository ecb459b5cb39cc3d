"""The OpenAI-compatible P/D proxy: FastAPI in front of prefill and decode vLLM servers, httpx behind.

Routes: POST /v1/completions and /v1/chat/completions (streaming too), GET /v1/models, /health, /metrics.
Each generation request goes to a prefill server (max_tokens=1, do_remote_decode) and then to a decode server
with the kv_transfer_params that came back; both hops carry the same X-Request-Id.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from hybridserve.core.proxy import hops, streaming
from hybridserve.core.proxy.config import ProxyConfig
from hybridserve.core.proxy.metrics import ProxyMetrics
from hybridserve.core.proxy.routing import EndpointPool
from hybridserve.core.vllm_plugin import timeline


def create_app(config: ProxyConfig, *, transport: httpx.AsyncBaseTransport | None = None) -> FastAPI:
    """`transport` replaces the network for tests (httpx.MockTransport); None: real connections."""
    prefill_pool = EndpointPool("prefill", config.prefill_urls, config.policy)
    decode_pool = EndpointPool("decode", config.decode_urls, config.policy)
    metrics = ProxyMetrics()
    if timeline.path_from_env() is not None:  # HYBRIDSERVE_TIMELINE_FILE: the hop events of each request
        timeline.open_file(timeline.path_from_env())

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):  # noqa: ANN202
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        async with httpx.AsyncClient(timeout=httpx.Timeout(config.timeout_s), limits=limits,
                                     transport=transport) as client:
            app.state.client = client
            yield

    app = FastAPI(title="hybridserve P/D proxy", lifespan=lifespan)

    async def generate(request: Request, path: str) -> Any:
        try:
            body = await request.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            metrics.requests["bad_request"] += 1
            return JSONResponse({"error": {"message": "request body must be a JSON object", "code": 400}}, 400)
        headers = {"X-Request-Id": request.headers.get("x-request-id") or uuid.uuid4().hex}
        client: httpx.AsyncClient = request.app.state.client
        rid = headers["X-Request-Id"]
        try:
            timeline.emit("hop1_start", rid)
            kv_params = await _timed(metrics, "prefill", _prefill(client, prefill_pool, path, body, headers))
            timeline.emit("hop1_end", rid)
            if body.get("stream"):
                return await _decode_stream(client, decode_pool, path, body, kv_params, headers, metrics)
            timeline.emit("hop2_start", rid)
            answer = await _timed(metrics, "decode", _decode(client, decode_pool, path, body, kv_params, headers))
        except hops.HopError as err:
            metrics.requests[err.outcome] += 1
            return JSONResponse(err.body(), status_code=err.status)
        metrics.requests["ok"] += 1
        return JSONResponse(answer)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        return await generate(request, "/v1/completions")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        return await generate(request, "/v1/chat/completions")

    @app.get("/v1/models")
    async def models(request: Request) -> Any:
        url = decode_pool.pick()
        try:
            response = await request.app.state.client.get(f"{url}/v1/models")
            return JSONResponse(response.json(), status_code=response.status_code)
        except (httpx.HTTPError, ValueError) as exc:
            err = hops.HopError("decode", url, 502, f"{type(exc).__name__}: {exc}")
            return JSONResponse(err.body(), status_code=502)

    @app.get("/health")
    async def health() -> Any:
        return {"status": "ok", "prefill": list(config.prefill_urls), "decode": list(config.decode_urls)}

    @app.get("/metrics")
    async def prometheus() -> Any:
        outstanding = {"prefill": prefill_pool.outstanding, "decode": decode_pool.outstanding}
        return PlainTextResponse(metrics.render(outstanding))

    return app


async def _timed(metrics: ProxyMetrics, hop: str, awaitable: Any) -> Any:
    start = time.perf_counter()
    try:
        return await awaitable
    finally:
        metrics.observe_hop(hop, time.perf_counter() - start)


async def _prefill(client, pool: EndpointPool, path: str, body: dict, headers: dict) -> dict:  # noqa: ANN001
    with pool.use() as url:
        return await hops.prefill(client, url, path, body, headers)


async def _decode(client, pool: EndpointPool, path: str, body: dict, kv: dict, headers: dict) -> dict:  # noqa: ANN001
    with pool.use() as url:
        return await hops.post_json(client, "decode", url, path, hops.decode_body(body, kv), headers)


async def _decode_stream(client: httpx.AsyncClient, pool: EndpointPool, path: str, body: dict, kv: dict,
                         headers: dict, metrics: ProxyMetrics) -> StreamingResponse:
    url = pool.pick()
    pool.outstanding[url] += 1
    timeline.emit("hop2_start", headers["X-Request-Id"])
    try:
        request = client.build_request("POST", f"{url}{path}", json=hops.decode_body(body, kv), headers=headers)
        response = await client.send(request, stream=True)
    except httpx.TimeoutException as exc:
        pool.outstanding[url] -= 1
        raise hops.HopError("decode", url, 504, f"no answer within the timeout ({type(exc).__name__})") from None
    except httpx.HTTPError as exc:
        pool.outstanding[url] -= 1
        raise hops.HopError("decode", url, 502, f"{type(exc).__name__}: {exc or 'connection lost'}") from None
    if response.status_code != 200:
        text = (await response.aread())[:300].decode(errors="replace")
        await response.aclose()
        pool.outstanding[url] -= 1
        raise hops.status_error("decode", url, response.status_code, text)

    async def events():  # noqa: ANN202
        failed = finished = stamped = False
        try:
            async for chunk in streaming.relay(response, url):
                if not stamped:
                    timeline.emit("hop2_first_byte", headers["X-Request-Id"])
                    stamped = True
                failed = failed or chunk.startswith(b"data: {\"error\"")
                yield chunk
            finished = True
        finally:  # a client that goes away cancels this generator: neither ok nor a decode error
            pool.outstanding[url] -= 1
            metrics.requests["decode_error" if failed else "ok" if finished else "cancelled"] += 1

    return StreamingResponse(events(), media_type="text/event-stream")
