"""The numbers a sizing decision is made on, computed the same way from a simulation and from bench's records:
TTFT and ITL percentiles (ITL pooled over every request's gaps, as bench and vLLM's `bench serve` pool them),
output tokens per second, and goodput: requests per second that met both SLOs (workload.Slo), over the same wall
time (first send to last answer) bench divides by. Per GPU share: divided by the engines the deployment used.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from hybridserve.core.bench.client_stats import percentile
from hybridserve.core.sizing.workload import Slo


@dataclass(frozen=True, kw_only=True)
class Served:
    """One request as served: sent at `start_s`, its first token `ttft_s` later, then gaps `itls_s`."""

    start_s: float
    ttft_s: float
    itls_s: tuple[float, ...]
    end_s: float
    output_tokens: int

    @property
    def tpot_s(self) -> float:
        """vLLM's TPOT, as bench's goodput takes it (core/bench/goodput.py `request_itl_s`)."""
        if self.output_tokens <= 1:
            return 0.0
        return (self.end_s - self.start_s - self.ttft_s) / (self.output_tokens - 1)


@dataclass(frozen=True, kw_only=True)
class ServedStats:
    num_requests: int
    wall_s: float
    ttft_p50_s: float
    ttft_p90_s: float
    itl_p50_s: float | None
    itl_p90_s: float | None
    output_tokens_per_s: float
    requests_per_s: float
    goodput: float  # requests/s that met both SLOs
    attainment: float  # share of requests that met both
    num_units: int  # engines (GPU shares, GPUs or cores) the deployment used
    attainment_target: float = 0.9  # the SLO's share (workload.Slo.attainment)

    @property
    def is_slo_met(self) -> bool:
        return self.attainment >= self.attainment_target

    @property
    def goodput_per_unit(self) -> float:
        return self.goodput / self.num_units

    @property
    def output_tokens_per_s_per_unit(self) -> float:
        return self.output_tokens_per_s / self.num_units


def served_stats(requests: Iterable[Served], slo: Slo, num_units: int) -> ServedStats:
    served = list(requests)
    if not served:
        raise ValueError("no request was served")
    wall = max(r.end_s for r in served) - min(r.start_s for r in served)
    met = sum(1 for r in served if slo.is_met(r.ttft_s, r.tpot_s))
    ttfts = [r.ttft_s for r in served]
    itls = [g for r in served for g in r.itls_s]
    return ServedStats(
        num_requests=len(served), wall_s=wall, ttft_p50_s=percentile(ttfts, 50), ttft_p90_s=percentile(ttfts, 90),
        itl_p50_s=percentile(itls, 50), itl_p90_s=percentile(itls, 90),
        output_tokens_per_s=sum(r.output_tokens for r in served) / wall if wall > 0 else 0.0,
        requests_per_s=len(served) / wall if wall > 0 else 0.0, goodput=met / wall if wall > 0 else 0.0,
        attainment=met / len(served), num_units=num_units, attainment_target=slo.attainment)


def from_simulation(result) -> list[Served]:  # noqa: ANN001 (simulate.SimResult)
    return [Served(start_s=r.arrival_s, ttft_s=r.ttft_s, itls_s=tuple(r.itls_s), end_s=r.end_s,
                   output_tokens=len(r.token_times)) for r in result.requests if r.token_times]


def from_bench_records(records: Iterable[dict]) -> list[Served]:
    """bench's JSON records (cli/bench_render.report_dict): the ones answered, probes left out."""
    return [Served(start_s=r["start_s"], ttft_s=r["ttft_s"], itls_s=tuple(r["itl_s"]), end_s=r["start_s"] + r["e2e_s"],
                   output_tokens=r["output_tokens"])
            for r in records if not r.get("is_probe") and r.get("error") is None and r.get("ttft_s") is not None]
