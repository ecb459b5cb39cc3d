"""Fetching `/metrics` of the decode servers, and finding them behind the project's proxy (its /health lists them)."""

from __future__ import annotations

import time
from typing import Any

from hybridserve.core.bench.server_metrics import Samples, parse_prometheus
from hybridserve.core.common.errors import CouldNotRunError

SETTLE_S = 0.25  # vLLM's API server records the engine's stats as its outputs arrive: rescrape until still
SETTLE_MAX_S = 5.0


def scrape(client: Any, urls: tuple[str, ...]) -> Samples:
    """The summed samples of every URL's /metrics."""
    import httpx

    total: dict = {}
    for url in urls:
        try:
            response = client.get(f"{url}/metrics")
        except httpx.HTTPError as exc:
            raise CouldNotRunError(f"metrics {url}/metrics: {type(exc).__name__}: {exc}") from None
        if response.status_code != 200:
            raise CouldNotRunError(f"metrics {url}/metrics: HTTP {response.status_code}")
        for key, value in parse_prometheus(response.text).items():
            total[key] = total.get(key, 0.0) + value
    return total


def settled_scrape(client: Any, urls: tuple[str, ...], keys: tuple[tuple[str, None], ...]) -> Samples:
    """Scrape until `keys` stop changing between two scrapes SETTLE_S apart (at most SETTLE_MAX_S)."""
    deadline = time.monotonic() + SETTLE_MAX_S
    last = scrape(client, urls)
    while time.monotonic() < deadline:
        time.sleep(SETTLE_S)
        now = scrape(client, urls)
        if all(now.get(k) == last.get(k) for k in keys):
            return now
        last = now
    return last


def proxy_health(client: Any, url: str) -> dict:
    """The project's proxy's /health answer (its decode URLs, who samples token 1); {} for anything else (a plain
    server's /health has no body)."""
    import httpx

    try:
        answer = client.get(f"{url}/health")
        body = answer.json() if answer.status_code == 200 else {}
    except (httpx.HTTPError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


def own_metrics(client: Any, url: str) -> tuple[str, ...]:
    """(url,) when the server answers /metrics; () for a front door without it (Ray Serve's ingress: its engines
    report to Ray's metrics agent, not over HTTP), whose phases then have client-side numbers only."""
    import httpx

    try:
        return (url,) if client.get(f"{url}/metrics").status_code == 200 else ()
    except httpx.HTTPError:
        return (url,)  # scrape names the error


def decode_urls_behind(health: dict) -> tuple[str, ...]:
    """The decode servers the project's proxy routes to, from its /health (proxy_health); () for a plain server."""
    decode = health.get("decode")
    return tuple(str(u).rstrip("/") for u in decode) if isinstance(decode, list) else ()


def prefill_urls_behind(health: dict) -> tuple[str, ...]:
    """The prefill servers the project's proxy routes to, from its /health; () for a plain server."""
    prefill = health.get("prefill")
    return tuple(str(u).rstrip("/") for u in prefill) if isinstance(prefill, list) else ()


def first_token_behind(health: dict) -> str | None:
    """Which role samples token 1 behind the project's proxy ("prefill" or "decode"); None: not our proxy."""
    value = health.get("first_token")
    return value if isinstance(value, str) else None
