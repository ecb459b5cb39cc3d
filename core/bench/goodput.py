"""Goodput (DistServe, OSDI 2024): the requests per second that meet the latency objectives, TTFT and ITL.

As vLLM's `bench serve --goodput` counts it (vllm/benchmarks/serve.py `calculate_metrics`, 0.26 and 0.32): a
request is good when its TTFT and its time per output token are at most their objectives, and goodput is the good
requests over the run's duration. A request's ITL here is that per-request mean, vLLM's TPOT: (end-to-end - TTFT) /
(output tokens - 1), 0 for a single-token output, so a long stall and an even stream of the same total weigh alike.
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridserve.core.bench.stream import RequestRecord
from hybridserve.core.common.errors import InputError


@dataclass(frozen=True, kw_only=True)
class Slo:
    ttft_s: float | None = None  # --slo-ttft (given in ms)
    itl_s: float | None = None  # --slo-itl (ms): the per-request mean ITL

    @property
    def name(self) -> str:
        parts = [f"TTFT <= {self.ttft_s * 1e3:g} ms" if self.ttft_s is not None else "",
                 f"ITL <= {self.itl_s * 1e3:g} ms" if self.itl_s is not None else ""]
        return ", ".join(p for p in parts if p)


def make_slo(ttft_ms: float | None, itl_ms: float | None) -> Slo | None:
    """From the command line; None when neither objective is given (no goodput then)."""
    for value, flag in ((ttft_ms, "--slo-ttft"), (itl_ms, "--slo-itl")):
        if value is not None and not value > 0:
            raise InputError(f"{flag} {value}: accepted: a positive number of milliseconds")
    if ttft_ms is None and itl_ms is None:
        return None
    return Slo(ttft_s=ttft_ms / 1e3 if ttft_ms is not None else None,
               itl_s=itl_ms / 1e3 if itl_ms is not None else None)


def request_itl_s(record: RequestRecord) -> float:
    """vLLM's TPOT of one answered request."""
    if record.output_tokens <= 1:
        return 0.0
    return (record.e2e_s - record.ttft_s) / (record.output_tokens - 1)


def is_good(record: RequestRecord, slo: Slo) -> bool:
    if not record.is_ok:
        return False
    return ((slo.ttft_s is None or record.ttft_s <= slo.ttft_s)
            and (slo.itl_s is None or request_itl_s(record) <= slo.itl_s))
