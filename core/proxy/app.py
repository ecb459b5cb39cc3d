"""The OpenAI-compatible P/D proxy: FastAPI in front of prefill and decode vLLM servers, httpx behind.

Routes: POST /v1/completions and /v1/chat/completions (streaming too), GET /v1/models, /health, /metrics. With a
front key every route but /health and /metrics asks for it (auth.py).
Each generation request goes to a prefill server (max_tokens=1, do_remote_decode) and then to a decode server
with the kv_transfer_params that came back; both hops carry the same X-Request-Id. With `first_token` prefill (the
default) a plain completion gets its first token from the prefill hop (first_token.py); otherwise, and for chat,
decode samples it.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from hybridserve.core.launch.topology import FirstTokenSource
from hybridserve.core.proxy import eligibility, first_token, hops, streaming
from hybridserve.core.proxy.auth import BearerGuard
from hybridserve.core.proxy.config import ProxyConfig
from hybridserve.core.proxy.metrics import ProxyMetrics
from hybridserve.core.proxy.routing import EndpointPool
from hybridserve.core.vllm_plugin import timeline


def create_app(config: ProxyConfig, *, transport: httpx.AsyncBaseTransport | None = None) -> FastAPI:
    """`transport` replaces the network for tests (httpx.MockTransport); None: real connections."""
    prefill_pool = EndpointPool("prefill", config.prefill_urls, config.policy)
    decode_pool = EndpointPool("decode", config.decode_urls, config.policy)
    metrics = ProxyMetrics()
    model_lens: dict[str, int | None] = {}  # decode's max_model_len, asked once (first_token.fits)
    if timeline.path_from_env() is not None:  # HYBRIDSERVE_TIMELINE_FILE: the hop events of each request
        timeline.open_file(timeline.path_from_env())

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):  # noqa: ANN202
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        # every call to an engine (both hops, /v1/models, /detokenize) carries the engine key, never the client's
        headers = {"Authorization": f"Bearer {config.engine_key}"} if config.engine_key else None
        async with httpx.AsyncClient(timeout=httpx.Timeout(config.timeout_s), limits=limits, headers=headers,
                                     transport=transport) as client:
            app.state.client = client
            yield

    app = FastAPI(title="hybridserve P/D proxy", lifespan=lifespan)
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
        headers = {"X-Request-Id": request.headers.get("x-request-id") or uuid.uuid4().hex}
        client: httpx.AsyncClient = request.app.state.client
        rid = headers["X-Request-Id"]
        if config.first_token is FirstTokenSource.PREFILL:
            route = eligibility.route(path, body)
            metrics.observe_route(route)
            if route.is_first_token:
                return await _via_prefill_token(client, prefill_pool, decode_pool, path, body, headers, metrics,
                                                model_lens)
        try:
            timeline.emit("hop1_start", rid)
            kv_params = await _timed(metrics, "prefill", _prefill(client, prefill_pool, path, body, headers))
            timeline.emit("hop1_end", rid)
            if body.get("stream"):
                return await _decode_stream(client, decode_pool, path, hops.decode_body(body, kv_params), headers,
                                            metrics)
            timeline.emit("hop2_start", rid)
            _, answer = await _timed(metrics, "decode", _post_decode(client, decode_pool, path,
                                                                     hops.decode_body(body, kv_params), headers))
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
        return {"status": "ok", "prefill": list(config.prefill_urls), "decode": list(config.decode_urls),
                "first_token": config.first_token.value}

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


async def _via_prefill_token(client: httpx.AsyncClient, prefill_pool: EndpointPool, decode_pool: EndpointPool,
                             path: str, body: dict, headers: dict, metrics: ProxyMetrics, cache: dict) -> Any:
    """Prefill computes the whole prompt and samples token 1; decode continues from it (first_token.py)."""
    rid = headers["X-Request-Id"]
    try:
        timeline.emit("hop1_start", rid)
        first = await _timed(metrics, "prefill", _prefill_first(client, prefill_pool, path, body, headers))
        timeline.emit("hop1_end", rid)
        if first.is_last:
            metrics.requests["ok"] += 1
            if body.get("stream"):
                return StreamingResponse(_replay(first_token.first_events(first, body)),
                                         media_type="text/event-stream")
            return JSONResponse(first_token.client_answer(first, body))
        decode = first_token.decode_body(body, first)
        if body.get("stream"):
            room = await _max_model_len(client, decode_pool, cache)
            return await _decode_stream(client, decode_pool, path, decode, headers, metrics, first=first,
                                        head=first_token.first_events(first, body), client_body=body,
                                        is_early=first_token.fits(first, body, room))
        timeline.emit("hop2_start", rid)
        url, answer = await _timed(metrics, "decode", _post_decode(client, decode_pool, path, decode, headers))
        text = None
        if not first.is_text_whole:
            ids = [*first.token_ids, *(answer["choices"][0].get("token_ids") or [])]
            text = (await _detokenizer(client, url, body)(ids)).rstrip("\ufffd")  # as TextRepair
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


def _detokenizer(client: httpx.AsyncClient, url: str, body: dict, role: str = "decode") -> first_token.Detokenize:
    """Token ids -> text by a server's /detokenize (first_token.TextRepair, first_token.with_hidden_text)."""
    async def detokenize(ids: list[int]) -> str:
        answer = await hops.post_json(client, role, url, "/detokenize",
                                      {"model": body.get("model"), "tokens": ids}, {})
        return str(answer.get("prompt", ""))
    return detokenize


async def _prefill_first(client, pool: EndpointPool, path: str, body: dict,  # noqa: ANN001
                         headers: dict) -> first_token.FirstToken:
    sent = first_token.prefill_body(body)
    with pool.use() as url:
        answer = await hops.post_json(client, "prefill", url, path, sent, headers)
        first = first_token.FirstToken.parse(url, sent, answer)
        return await first_token.with_hidden_text(first, _detokenizer(client, url, body, "prefill"))


async def _post_decode(client, pool: EndpointPool, path: str, decode: dict,  # noqa: ANN001
                       headers: dict) -> tuple[str, dict]:
    with pool.use() as url:
        return url, await hops.post_json(client, "decode", url, path, decode, headers)


async def _replay(events: list[bytes]):  # noqa: ANN202
    for event in events:
        yield event


async def _open_stream(client: httpx.AsyncClient, url: str, path: str, decode: dict, headers: dict) -> httpx.Response:
    """POST for a stream; a transport failure or a non-200 answer raises HopError naming decode."""
    try:
        request = client.build_request("POST", f"{url}{path}", json=decode, headers=headers)
        response = await client.send(request, stream=True)
    except httpx.TimeoutException as exc:
        raise hops.HopError("decode", url, 504, f"no answer within the timeout ({type(exc).__name__})") from None
    except httpx.HTTPError as exc:
        raise hops.HopError("decode", url, 502, f"{type(exc).__name__}: {exc or 'connection lost'}") from None
    if response.status_code != 200:
        text = (await response.aread())[:300].decode(errors="replace")
        await response.aclose()
        raise hops.status_error("decode", url, response.status_code, text)
    return response


async def _decode_stream(client: httpx.AsyncClient, pool: EndpointPool, path: str, decode: dict, headers: dict,
                         metrics: ProxyMetrics, *, first: first_token.FirstToken | None = None,
                         head: list[bytes] = (), client_body: dict | None = None,
                         is_early: bool = False) -> StreamingResponse:
    """Relay decode's stream. With `first`, token 1 goes out (`head`) before decode's events, which are rewritten to
    account for it. Decode's stream is opened first, so that its refusal is still an HTTP error, unless `is_early`:
    then token 1 goes out at once and a decode failure becomes an error event (vLLM's API server sends its response
    headers only with the first token: waiting for them cost a whole decode step, 70-90 ms on the H200)."""
    url = pool.pick()
    pool.outstanding[url] += 1
    rid = headers["X-Request-Id"]
    timeline.emit("hop2_start", rid)
    opened = None
    if not is_early:
        try:
            opened = await _open_stream(client, url, path, decode, headers)
        except hops.HopError:
            pool.outstanding[url] -= 1
            raise

    async def events():  # noqa: ANN202
        failed = finished = stamped = False
        try:
            for event in head:
                yield event
            if head:
                timeline.emit("first_token_out", rid)
            response = opened or await _open_stream(client, url, path, decode, headers)
            relayed = streaming.relay(response, url)
            if first is not None:
                repair = None if first.is_text_whole else first_token.TextRepair(first, _detokenizer(client, url,
                                                                                                      decode))
                relayed = first_token.rewrite_stream(relayed, first, client_body or decode, repair)
            async for chunk in relayed:
                if not stamped:
                    timeline.emit("hop2_first_byte", rid)
                    stamped = True
                failed = failed or chunk.startswith(b"data: {\"error\"")
                yield chunk
            finished = True
        except hops.HopError as err:  # after token 1 (is_early), or TextRepair's /detokenize: the client learns it
            failed = True
            yield streaming.error_event(url, err.reason, status=err.status)
        finally:  # a client that goes away cancels this generator: neither ok nor a decode error
            pool.outstanding[url] -= 1
            metrics.requests["decode_error" if failed else "ok" if finished else "cancelled"] += 1

    return StreamingResponse(events(), media_type="text/event-stream")
