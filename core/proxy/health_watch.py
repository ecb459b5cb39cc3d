"""Which engine servers are up, as the proxy sees them: a probe of every server's /health each interval, and a hop
that could not reach a server marks it down at once (until a probe finds it answering 200 again).

vLLM answers /health with 200 while its engine runs and 503 once the engine core is dead; a server being restarted
by launch (core/supervise/role_watch.py) does not answer at all. The proxy's own /health lists the servers down, and
routing (routing.py) skips them while another server of the role is up. With launch's warm file (`--warm-file`,
core/common/warm_state.py) a server that answers 200 while launch still warms it up after a restart stays down.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import httpx

from hybridserve.core.common.warm_state import WARMING, read_warm_state

PROBE_TIMEOUT_S = 2.0  # a busy server's /health may wait behind its work; a dead one refuses at once
logger = logging.getLogger("hybridserve.proxy")
SLOW_PROBES = 3


# A hop's failure marks a server down for this long, or until a probe says otherwise (a proxy run without probes,
# as in tests, tries the server again afterwards).
HOP_DOWN_S = 5.0


class EndpointHealth:
    """Up/down per server URL; every server starts up (launch starts the proxy once the engines are healthy)."""

    def __init__(self, urls: tuple[str, ...], *, warm_file: Path | None = None) -> None:
        self.warm_file = warm_file  # launch's (warm_state.py); None: /health alone decides
        self.down: dict[str, str] = {}  # url -> why
        self.since: dict[str, float] = {}  # url -> time.time() it went down
        self.expires: dict[str, float] = {}  # url -> when a hop's mark lapses (probes' marks do not)
        self.slow: dict[str, int] = {}  # url -> probes in a row that got no answer in time
        self.urls = urls
        self._client: httpx.AsyncClient | None = None  # probe_forever's, for check_now
        self._checking: set[asyncio.Task] = set()

    def is_up(self, url: str) -> bool:
        if url in self.expires and time.time() > self.expires[url]:
            self.mark_up(url)
        return url not in self.down

    def mark_down(self, url: str, why: str, *, is_probe: bool = False) -> None:
        if url not in self.down:
            self.since[url] = time.time()
            logger.warning("hybridserve proxy: %s is down (%s)", url, why)
        self.down[url] = why
        if is_probe:
            self.expires.pop(url, None)
        else:
            self.expires[url] = time.time() + HOP_DOWN_S

    def mark_up(self, url: str) -> None:
        if url in self.down:
            logger.warning("hybridserve proxy: %s is up again", url)
        for table in (self.down, self.since, self.expires):
            table.pop(url, None)

    def report(self) -> dict[str, dict[str, object]]:
        """{url: {"why": ..., "down_s": ...}} for the servers down now."""
        now = time.time()
        return {url: {"why": self.down[url], "down_s": round(now - self.since[url], 1)}
                for url in list(self.down) if not self.is_up(url)}

    async def probe(self, client: httpx.AsyncClient) -> None:
        """Ask every server's /health once, all at once."""
        await asyncio.gather(*(self._probe_one(client, url) for url in self.urls))

    async def _probe_one(self, client: httpx.AsyncClient, url: str) -> None:
        """Refused or not 200: down at once. No answer in time: still up, noted as slow (logged at SLOW_PROBES in a
        row). A busy CPU server can leave /health unanswered for 15 s and more while it serves: two CI runs on a
        loaded 2-core box marked a working decode server down that way (3 probes of 2 s, then of 5 s) and the proxy
        served a request by prefill alone. A server that hangs for good shows as hop timeouts, which fail the
        request (not retried: the client has waited once); a dead one refuses, and is down at once."""
        try:
            response = await client.get(f"{url}/health", timeout=PROBE_TIMEOUT_S)
        except httpx.TimeoutException as exc:
            self.slow[url] = self.slow.get(url, 0) + 1
            if self.slow[url] == SLOW_PROBES:
                logger.warning("hybridserve proxy: %s answers /health slowly (%s %d times), kept in rotation", url,
                               type(exc).__name__, SLOW_PROBES)
            return
        except httpx.HTTPError as exc:
            self.mark_down(url, f"/health: {type(exc).__name__}", is_probe=True)
            return
        self.slow.pop(url, None)
        if response.status_code == 200 and self.is_warming(url):
            self.mark_down(url, "warming up (launch's warm-up burst after a restart)", is_probe=True)
        elif response.status_code == 200:
            self.mark_up(url)
        else:
            self.mark_down(url, f"/health: HTTP {response.status_code}", is_probe=True)

    def is_warming(self, url: str) -> bool:
        return self.warm_file is not None and read_warm_state(self.warm_file).get(url) == WARMING

    def check_now(self, url: str) -> None:
        """Probe `url` now, not at its next turn: a hop's connection broke mid-request. A dead server refuses and is
        down at once; a live one whose keep-alive reset the connection (keepalive.py) answers, or is slow, and stays
        up. Without it, a SIGKILLed decode stayed up to the proxy for 2 s and more on a loaded 2-core box, each of
        its probes queued behind the relays. A proxy run without probes (tests) has no client: nothing to do."""
        if self._client is None or any(task.get_name() == url for task in self._checking):
            return
        task = asyncio.get_running_loop().create_task(self._probe_one(self._client, url), name=url)
        self._checking.add(task)
        task.add_done_callback(self._checking.discard)

    async def probe_forever(self, client: httpx.AsyncClient, interval_s: float) -> None:
        """Each server on its own clock: a busy server's probe waits up to PROBE_TIMEOUT_S, and a round that waited
        for it put off every other server's probe too (a CI run on the 2-core box saw a SIGKILLed decode still up
        2 s after its death, its peer's probe waiting; a decode that had come up was still down to the proxy)."""
        self._client = client
        await asyncio.gather(*(self._probe_every(client, url, interval_s) for url in self.urls))

    async def _probe_every(self, client: httpx.AsyncClient, url: str, interval_s: float) -> None:
        while True:
            await self._probe_one(client, url)
            await asyncio.sleep(interval_s)
