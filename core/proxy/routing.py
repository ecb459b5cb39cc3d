"""Pick a server for each hop: round-robin, or the one with the fewest requests in flight."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator

from hybridserve.core.launch.topology import RoutingPolicy


class EndpointPool:
    """The servers of one role. Not thread-safe: the proxy uses it from its single event loop."""

    def __init__(self, role: str, urls: tuple[str, ...], policy: RoutingPolicy) -> None:
        if not urls:
            raise ValueError(f"no {role} servers")
        self.role, self.urls, self.policy = role, urls, policy
        self.outstanding = {url: 0 for url in urls}
        self._cycle = itertools.cycle(urls)

    def pick(self) -> str:
        if self.policy is RoutingPolicy.LEAST_OUTSTANDING:
            # ties go to the earliest-listed server; min() keeps the first of equals
            return min(self.urls, key=lambda url: self.outstanding[url])
        return next(self._cycle)

    @contextlib.contextmanager
    def use(self) -> Iterator[str]:
        """Pick a server and count the request as outstanding on it until the block exits."""
        url = self.pick()
        self.outstanding[url] += 1
        try:
            yield url
        finally:
            self.outstanding[url] -= 1
