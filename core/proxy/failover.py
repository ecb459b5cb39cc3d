"""Retries and fallbacks: one request's way around a role that failed it before any byte reached the client.

- What is retried: a role's failure (a 5xx, a connection refused or broken). Not a 4xx (the client's mistake, passed
  on as it is), not a timeout (the client has already waited the whole per-hop timeout once).
- Prefill failed: another prefill server that is up. None: the client's request goes to a decode server as a plain
  request and decode computes the prompt itself. That is what vLLM does inside decode with
  `kv_load_failure_policy="recompute"` when the KV cannot be loaded (config/kv_transfer.py; the scheduler's
  `_update_requests_with_invalid_blocks` resets the request's computed tokens to 0); with vLLM's default "fail"
  decode answers 500 instead.
- Decode failed: another decode server that is up. It gets the same kv_transfer_params only when the failed one never
  saw the request (the connection was refused): prefill's blocks are then untouched. Otherwise the failed decode may
  have read them, and prefill frees blocks once a reader says it is done; a later READ of blocks freed that way is
  not refused (prefill only logs "Potentially invalid KV blocks for unrecognized request",
  ../shared/reference/vllm_cpu_pd_baseline.md; decode's lease guard knows the lease's end, not an earlier free), so
  the next decode computes the prompt itself. No decode left:
  prefill alone serves the request as a plain one (llm-d's fallback). The blocks it holds for the READ that never
  came are freed by vLLM at the end of the lease (kv_lease_duration, 30 s).
- Prefill's lease (core/common/kv_lease.py): a decode hop that would begin past the end prefill stamped into its
  kv_transfer_params (less the margin for clock skew) goes without them, and decode computes the prompt itself: the
  blocks may be freed and reused by now (counted as `dropped`, a `lease_dropped` timeline event). A decode that
  received them in time and still could not read them in time refuses the READ itself (core/vllm_plugin/lease_guard.py).
- A role with no server up (health_watch.py) is routed around before a hop is tried. A hop marks a server down only
  when its connection was refused; a connection broken mid-request leaves that to the health probe.
- At most MAX_FAILURES failures a request: the H200's decode engine died on a request (issue 30); retried on every
  server, such a request could stop them all.

Each retry and fallback is counted (metrics.py) and is an event of the request's timeline (`retry`, `fallback`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from hybridserve.core.common import kv_lease, timeline_log
from hybridserve.core.proxy.hops import HopError
from hybridserve.core.proxy.prometheus import ProxyMetrics
from hybridserve.core.proxy.routing import EndpointPool
from hybridserve.core.proxy.stopping import Stopping

Send = Callable[[str, str, dict], Awaitable[Any]]  # (role, url, body) -> answer; HopError before any byte went out
Served = tuple[str, str, Any]  # (role, url, answer)
MAX_FAILURES = 3  # a request's 3rd failure goes to the client: one server of each role plus one more tried
logger = logging.getLogger("hybridserve.proxy")  # one line per failure and fallback: what it cost, and why


def now_unix() -> float:
    return time.time()


def is_retryable(err: HopError) -> bool:
    return not err.is_client_error and not err.is_timeout


class Route:
    """One request's failures so far (servers it will not go back to) and what was done about them."""

    def __init__(self, rid: str, prefill: EndpointPool | None, decode: EndpointPool | None, metrics: ProxyMetrics,
                 *, replica: EndpointPool | None = None, stopping: Stopping | None = None) -> None:
        """P/D's two pools, or (aggregated serving) the replicas' pool alone; `stopping`: the proxy's (stopping.py)."""
        self.rid, self.metrics = rid, metrics
        pools = {"prefill": prefill, "decode": decode, "replica": replica}
        self.pools = {role: pool for role, pool in pools.items() if pool is not None}
        self.avoid: set[str] = set()
        self.errors: list[HopError] = []
        self.lease_margin_s = kv_lease.margin_from_env()
        self.stopping = stopping or Stopping()
        self.trying: tuple[str, str] | None = None  # (role, url) of the server picked last: the one in use

    def pick(self, role: str) -> str | None:
        url = self.pools[role].choose(self.avoid)
        if url is not None:
            self.trying = (role, url)
        return url

    def has_up(self, role: str) -> bool:
        pool = self.pools[role]
        return any(url not in self.avoid and pool.health.is_up(url) for url in pool.urls)

    def servers_up(self, role: str, url: str) -> list[tuple[str, str]]:
        """(role, url) of `url` first, then every other server up, decode's first."""
        others = [(r, u) for r in ("decode", "prefill", "replica") if r in self.pools for u in self.pools[r].urls
                  if u != url and self.pools[r].health.is_up(u)]
        return [(role, url), *others]

    def failed(self, err: HopError) -> None:
        """Note a role's failure; raise it again when it must reach the client as it is, or when this request has
        failed MAX_FAILURES times (a request that kills the engine serving it must not take every server down)."""
        if not is_retryable(err):
            raise err
        logger.warning("hybridserve proxy: request %s: %s %s failed: %s", self.rid, err.role, err.url, err.reason)
        self.avoid.add(err.url)
        self.errors.append(err)
        if err.is_unsent:  # nothing listens there: down until a probe finds it again
            self.pools[err.role].health.mark_down(err.url, err.reason)
        elif err.is_transport:
            # A connection broken mid-request proves less: a server that died (its next connection is refused) or one
            # whose keep-alive reset a pooled connection (keepalive.py). Marked down, that server took no request for
            # HOP_DOWN_S, and a 6 s stall of prefill's and the other decode's API servers after a decode's death left
            # none up: 21 of 30 requests failed at once (issue 39). A probe now tells the two apart.
            self.pools[err.role].health.check_now(err.url)
        if len(self.errors) >= MAX_FAILURES:
            raise self.give_up()

    def retried(self, role: str, failed_url: str, url: str, *, is_kv_kept: bool) -> None:
        self.metrics.retries[role] += 1
        timeline_log.emit("retry", self.rid, role=role, failed=failed_url, to=url, kv_kept=is_kv_kept)

    def fell_back(self, role: str, url: str) -> None:
        self.metrics.fallbacks[role] += 1
        timeline_log.emit("fallback", self.rid, served_by=role, url=url)
        logger.warning("hybridserve proxy: request %s served by %s %s alone (the other role has no server up or "
                       "left)", self.rid, role, url)

    def is_lease_left(self, with_kv: dict) -> bool:
        """Whether prefill still holds the blocks of `with_kv`'s parameters now; when not, counted and logged."""
        if not kv_lease.is_expired(with_kv.get("kv_transfer_params"), now_unix(), self.lease_margin_s):
            return True
        self.metrics.lease["dropped"] += 1
        timeline_log.emit("lease_dropped", self.rid)
        logger.warning("hybridserve proxy: request %s: prefill's KV lease ran out before the decode hop; decode "
                       "computes the prompt itself", self.rid)
        return False

    def stopped(self) -> HopError:
        """The proxy began to stop while this request's stream was opened or relayed: that failure, on the server
        in use, naming the failures before it (decode's, when prefill serves the request alone)."""
        role, url = self.trying or (next(iter(self.pools)), "-")
        self.errors.append(HopError(role, url, 503, "the proxy is stopping"))
        return self.give_up()

    def give_up(self) -> HopError:
        """The last failure, naming the ones before it; or, with none, that no server was up."""
        if not self.errors:
            roles = list(self.pools)
            return HopError(roles[-1], "-", 502, f"no {' or '.join(roles)} server is up")
        last, earlier = self.errors[-1], "; ".join(str(e) for e in self.errors[:-1])
        return HopError(last.role, last.url, last.status, f"{last.reason} (before it: {earlier})" if earlier
                        else last.reason, is_unsent=last.is_unsent, is_transport=last.is_transport)

    async def alone(self, role: str, send: Send, body: dict) -> Served:
        """Serve the request on a server of `role` alone, as a plain request (body without kv_transfer_params)."""
        body = {k: v for k, v in body.items() if k != "kv_transfer_params"}
        url = self.pick(role)
        if url is not None:
            self.fell_back(role, url)
        return await self.serve(role, send, body, url=url)

    async def serve(self, role: str, send: Send, body: dict, *, url: str | None = None) -> Served:
        """Serve the request on a server of `role` (`url` first, else the policy's pick), the next one up after a
        retryable failure: a replica's whole request, or a role serving alone."""
        url = url or self.pick(role)
        while url is not None:
            try:
                return role, url, await send(role, url, body)
            except HopError as err:
                self.failed(err)
                url = self.pick(role)
        raise self.give_up()


async def prefill_step(route: Route, hop: Callable[[str], Awaitable[Any]]) -> tuple[str, Any] | None:
    """Prefill's hop on the servers left: (url, its answer), or None when every prefill server failed or is down."""
    url = route.pick("prefill")
    while url is not None:
        try:
            with route.pools["prefill"].held(url):
                return url, await hop(url)
        except HopError as err:
            route.failed(err)
            url = route.pick("prefill")
            if url is not None:
                route.retried("prefill", err.url, url, is_kv_kept=False)
    return None


async def decode_step(route: Route, send: Send, with_kv: dict) -> Served:
    """Decode's hop (`with_kv`: prefill's kv_transfer_params in it) on the servers left, without the parameters once
    the blocks may be gone (a decode that may have read them failed, or prefill's lease ran out: the server computes
    the prompt itself); prefill alone when no decode server is left."""
    plain = {k: v for k, v in with_kv.items() if k != "kv_transfer_params"}
    is_kv_kept = True
    url = route.pick("decode")
    while url is not None:
        is_kv_kept = is_kv_kept and route.is_lease_left(with_kv)
        try:
            return "decode", url, await send("decode", url, with_kv if is_kv_kept else plain)
        except HopError as err:
            route.failed(err)
            is_kv_kept = is_kv_kept and err.is_unsent
            url = route.pick("decode")
            if url is not None:
                route.retried("decode", err.url, url, is_kv_kept=is_kv_kept)
    return await route.alone("prefill", send, plain)
