"""Load profiles: idle (one request at a time), a fixed number in flight, or a request rate with Poisson arrivals.

A rate follows vLLM's `bench serve --request-rate`: gaps between arrivals are exponential with mean 1/rate (a
Poisson process), drawn from a seeded generator so a run can be repeated; `max_concurrency` caps what is in flight
(vLLM's `--max-concurrency`). Idle is concurrency 1 without a rate: each request meets an otherwise empty server.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from hybridserve.core.common.errors import InputError


@dataclass(frozen=True, kw_only=True)
class Load:
    max_concurrency: int | None = 1  # None: no cap (only with a rate)
    request_rate: float | None = None  # requests per second; None: send as soon as a slot is free

    @property
    def is_idle(self) -> bool:
        return self.max_concurrency == 1 and self.request_rate is None

    @property
    def name(self) -> str:
        if self.is_idle:
            return "idle"
        parts = [] if self.max_concurrency is None else [f"concurrency {self.max_concurrency}"]
        if self.request_rate is not None:
            parts.append(f"rate {self.request_rate:g}/s")
        return ", ".join(parts)


def make_load(concurrency: int | None, request_rate: float | None) -> Load:
    """From the command line: neither given is idle; a rate alone has no concurrency cap."""
    if concurrency is not None and concurrency < 1:
        raise InputError(f"--concurrency {concurrency}: accepted: 1 or more requests in flight")
    if request_rate is not None and not request_rate > 0:
        raise InputError(f"--request-rate {request_rate}: accepted: a positive number of requests per second")
    if request_rate is None:
        return Load(max_concurrency=concurrency or 1)
    return Load(max_concurrency=concurrency, request_rate=request_rate)


def arrival_offsets(load: Load, num: int, rng: random.Random) -> tuple[float, ...]:
    """Seconds after the phase starts at which each request may be sent (all 0 without a rate)."""
    if load.request_rate is None:
        return (0.0,) * num
    offsets, now = [], 0.0
    for _ in range(num):
        offsets.append(now)
        now += rng.expovariate(load.request_rate)
    return tuple(offsets)
