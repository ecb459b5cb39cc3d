"""The proxy stopping: each stream it relays ends at once with the error event, never cut short by a kill.

uvicorn's graceful shutdown (a SIGTERM) waits for every open response, and a stream may run for minutes: prefill
alone serving 4,000 tokens after decode died (failover.py). launch stops the proxy first and SIGKILLs it
FRONT_GRACE_S (5 s) after its SIGTERM (core/supervise/process.py), which left such a client with a chunked body cut
short and no error event ("incomplete chunked read": test_launch_pd's decode kill, once in a CI run). server.py
sets `Stopping` as the shutdown begins; a relay waits for its server through `Stopping.chunks` and `guard`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


class ProxyStopping(Exception):
    """The proxy began to stop while a relay waited for its server (or before its next wait)."""


class Stopping:
    """Set once, when the proxy begins to stop; cuts the relays' waits for their servers then."""

    def __init__(self) -> None:
        self.is_set = False
        self._waits: set[asyncio.Timeout] = set()  # the waits in progress, each cut as asyncio.timeout cuts it

    def set(self) -> None:
        self.is_set = True
        for wait in self._waits:
            wait.reschedule(0)  # due now: that wait's task is cancelled there, and guard raises ProxyStopping

    async def guard(self, wait_for: Callable[[], Awaitable[T]]) -> T:
        """`wait_for()`'s result, or ProxyStopping once the proxy stops. Only the wait for the server is cut: a
        relay writing to its client when the stop comes sees it at its next wait."""
        if self.is_set:
            raise ProxyStopping
        try:
            async with asyncio.timeout(None) as wait:
                self._waits.add(wait)
                try:
                    return await wait_for()
                finally:
                    self._waits.discard(wait)
        except TimeoutError:
            if wait.expired():  # cut by set(), not a TimeoutError of wait_for's own
                raise ProxyStopping from None
            raise

    async def chunks(self, source: AsyncGenerator[bytes, None]) -> AsyncGenerator[bytes, None]:
        """`source`'s chunks until the proxy stops (then ProxyStopping); `source` is closed either way."""
        try:
            while True:
                try:
                    chunk = await self.guard(source.__anext__)
                except StopAsyncIteration:
                    return
                yield chunk
        finally:
            await source.aclose()
