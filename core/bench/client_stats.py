"""Client-side summaries of one phase: TTFT, inter-token latency and end-to-end latency percentiles, throughput.

Percentiles interpolate linearly between the two nearest ranks (numpy's default, which vLLM's `bench serve` uses).
ITL pools the gaps of every request (as vLLM's bench does), so long outputs weigh more than short ones. Goodput
(goodput.py) judges each request by its own mean ITL instead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from hybridserve.core.bench.goodput import Slo, is_good
from hybridserve.core.bench.stream import RequestRecord

PERCENTILES = (50, 90, 99)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True, kw_only=True)
class Spread:
    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None


def spread(values: Sequence[float]) -> Spread:
    return Spread(mean=sum(values) / len(values) if values else None, p50=percentile(values, 50),
                  p90=percentile(values, 90), p99=percentile(values, 99))


@dataclass(frozen=True, kw_only=True)
class ClientSummary:
    num_sent: int
    num_ok: int
    num_failed: int
    num_short: int  # answered with fewer tokens than asked (the context ran out)
    first_error: str | None
    wall_s: float  # first send to last answer
    ttft_s: Spread
    itl_s: Spread
    e2e_s: Spread
    input_tokens: int
    output_tokens: int
    num_good: int | None = None  # answered within the SLO (goodput.py); None: no SLO given

    def _per_s(self, count: float | None) -> float | None:
        return count / self.wall_s if count is not None and self.wall_s > 0 else None

    @property
    def request_throughput(self) -> float | None:
        return self._per_s(self.num_ok)

    @property
    def output_throughput(self) -> float | None:
        return self._per_s(self.output_tokens)

    @property
    def total_throughput(self) -> float | None:
        """Prompt and output tokens per second (vLLM bench serve's total_token_throughput)."""
        return self._per_s(self.input_tokens + self.output_tokens)

    @property
    def goodput(self) -> float | None:
        """Requests per second that met the SLO (DistServe's goodput)."""
        return self._per_s(self.num_good)


def summarize(records: Sequence[RequestRecord], slo: Slo | None = None) -> ClientSummary:
    ok = [r for r in records if r.is_ok]
    failed = [r for r in records if not r.is_ok]
    ends = [r.start_s + r.e2e_s for r in ok]
    wall = (max(ends) - min(r.start_s for r in records)) if ends else 0.0
    return ClientSummary(
        num_sent=len(records), num_ok=len(ok), num_failed=len(failed),
        num_short=sum(1 for r in ok if r.output_tokens < r.max_output_tokens),
        first_error=failed[0].error if failed else None, wall_s=wall,
        ttft_s=spread([r.ttft_s for r in ok]), itl_s=spread([g for r in ok for g in r.itl_s]),
        e2e_s=spread([r.e2e_s for r in ok]), input_tokens=sum(r.input_tokens for r in ok),
        output_tokens=sum(r.output_tokens for r in ok),
        num_good=sum(1 for r in ok if is_good(r, slo)) if slo is not None else None)
