"""Pick a server for each hop: round-robin, or the one with the fewest requests in flight; servers that are down
(health_watch.py) or that failed this request already are skipped (failover.py)."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Collection, Iterator

from hybridserve.core.launch.topology import RoutingPolicy
from hybridserve.core.proxy.health_watch import EndpointHealth


class EndpointPool:
    """The servers of one role. Not thread-safe: the proxy uses it from its single event loop."""

    def __init__(self, role: str, urls: tuple[str, ...], policy: RoutingPolicy,
                 health: EndpointHealth | None = None) -> None:
        if not urls:
            raise ValueError(f"no {role} servers")
        self.role, self.urls, self.policy = role, urls, policy
        self.health = health or EndpointHealth(urls)
        self.outstanding = {url: 0 for url in urls}
        self._cycle = itertools.cycle(urls)

    def pick(self) -> str:
        if self.policy is RoutingPolicy.LEAST_OUTSTANDING:
            # ties go to the earliest-listed server; min() keeps the first of equals
            return min(self.urls, key=lambda url: self.outstanding[url])
        return next(self._cycle)

    def choose(self, avoid: Collection[str] = ()) -> str | None:
        """A server that is up and not in `avoid`, by the policy; None when there is none."""
        usable = [url for url in self.urls if url not in avoid and self.health.is_up(url)]
        if not usable:
            return None
        if self.policy is RoutingPolicy.LEAST_OUTSTANDING:
            return min(usable, key=lambda url: self.outstanding[url])
        for _ in self.urls:  # the cycle's next usable server: round-robin over the ones up
            url = next(self._cycle)
            if url in usable:
                return url
        return usable[0]

    @contextlib.contextmanager
    def held(self, url: str) -> Iterator[str]:
        """Count a request as outstanding on `url` until the block exits."""
        self.outstanding[url] += 1
        try:
            yield url
        finally:
            self.outstanding[url] -= 1

    @contextlib.contextmanager
    def use(self) -> Iterator[str]:
        """Pick a server and count the request as outstanding on it until the block exits."""
        url = self.pick()
        self.outstanding[url] += 1
        try:
            yield url
        finally:
            self.outstanding[url] -= 1
