"""Streams the proxy relays: open one on a server (a refusal is still an HTTP error), then pass its events on, with
token 1 from prefill ahead of them (first_token.py), and end with an error event naming the role if it breaks."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import httpx

from hybridserve.core.common import timeline_log
from hybridserve.core.proxy import failover, first_token, hops, streaming
from hybridserve.core.proxy.prometheus import ProxyMetrics
from hybridserve.core.proxy.stopping import ProxyStopping


def detokenizer(client: httpx.AsyncClient, servers: list[tuple[str, str]], body: dict) -> first_token.Detokenize:
    """Token ids -> text by /detokenize (first_token.TextRepair) of the first of `servers` (role, url) that answers:
    the serving one first, then the others up (every engine has the model's tokenizer; the serving one may have
    died just after its answer)."""
    async def detokenize(ids: list[int]) -> str:
        failure = None
        for role, url in servers:
            try:
                answer = await hops.post_json(client, role, url, "/detokenize",
                                              {"model": body.get("model"), "tokens": ids}, {})
                return str(answer.get("prompt", ""))
            except hops.HopError as err:
                if err.is_client_error:
                    raise
                failure = err
        raise failure
    return detokenize


async def replay(events: list[bytes]):  # noqa: ANN202
    for event in events:
        yield event


async def open_stream(client: httpx.AsyncClient, role: str, url: str, path: str, body: dict,
                      headers: dict) -> httpx.Response:
    """POST for a stream; a transport failure or a non-200 answer raises HopError naming the role."""
    try:
        request = client.build_request("POST", f"{url}{path}", json=body, headers=headers)
        response = await client.send(request, stream=True)
    except httpx.HTTPError as exc:
        raise hops.transport_error(role, url, exc) from None
    if response.status_code != 200:
        text = (await response.aread())[:300].decode(errors="replace")
        await response.aclose()
        raise hops.status_error(role, url, response.status_code, text)
    return response


async def relay(route: failover.Route, metrics: ProxyMetrics, rid: str, served: failover.Served | None, *,
                step: Callable[[], Awaitable[failover.Served]] | None = None, client: httpx.AsyncClient | None = None,
                first: first_token.FirstToken | None = None, head: list[bytes] = (),
                client_body: dict | None = None):  # noqa: ANN202
    """The served stream's events. With `first`, token 1 goes out (`head`) before the server's events, which are
    rewritten to account for it. `served` None (token 1 fits: `first_token.fits`): token 1 goes out at once, then
    `step` finds a server (failover: the stream has not begun for the server's part); a failure there or later is an
    error event naming the role (vLLM's API server sends its response headers only with the first token: waiting
    for them cost a whole decode step, 70-90 ms on the H200). So is the proxy stopping (stopping.py) while it waits
    for the server."""
    failed = finished = stamped = False
    role = url = None
    try:
        for event in head:
            yield event
        if head:
            timeline_log.emit("first_token_out", rid)
        role, url, response = served or await route.stopping.guard(step)
        relayed = streaming.relay(response, url, role)
        if first is not None:
            repair = None if first.is_text_whole else first_token.TextRepair(
                first, detokenizer(client, route.servers_up(role, url), client_body))
            relayed = first_token.rewrite_stream(relayed, first, client_body, repair)
        async for chunk in route.stopping.chunks(relayed):
            if not stamped:
                timeline_log.emit("hop2_first_byte", rid)
                stamped = True
            failed = failed or chunk.startswith(b"data: {\"error\"")
            yield chunk
        finished = True
    except (hops.HopError, ProxyStopping) as exc:  # after token 1 (no server left), TextRepair's /detokenize, or
        err = route.stopped() if isinstance(exc, ProxyStopping) else exc  # the proxy stopping: the client learns it
        failed = True
        role = role or err.role
        yield streaming.error_event(err.url, err.reason, status=err.status, role=err.role)
    finally:  # a client that goes away cancels this generator: neither ok nor an error
        if url is not None:
            route.pools[role].outstanding[url] -= 1
        metrics.requests[f"{role}_error" if failed else "ok" if finished else "cancelled"] += 1
