"""A workload (prompt and output length distributions, Poisson arrivals at a rate) and its SLOs, drawn as `bench`
draws a phase: the same seed gives the same lengths and arrival times (core/bench/phase.py), so a prediction and a
measurement see the same requests.

Goodput (DistServe's measure, as vLLM's `bench serve --goodput` and bench's --slo-ttft/--slo-itl count it):
requests per second that meet both SLOs, a request's TTFT at most `ttft_s` and its mean inter-token latency (vLLM's
TPOT, (end - first token) / (tokens - 1)) at most `itl_s`. A run meets the SLO when at least `attainment` of its requests do
(DistServe: 90 %); the most a configuration can take is the highest arrival rate at which it still does.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from hybridserve.core.bench.lengths import LengthDist, parse_length
from hybridserve.core.bench.load import Load
from hybridserve.core.bench.phase import PhaseSpec, draw_work
from hybridserve.core.common.errors import InputError


@dataclass(frozen=True, kw_only=True)
class Slo:
    ttft_s: float
    itl_s: float
    attainment: float = 0.9  # share of requests that must meet both

    def is_met(self, ttft_s: float, tpot_s: float) -> bool:
        """bench's rule (core/bench/goodput.py `is_good`): TTFT and the request's TPOT within their objectives."""
        return ttft_s <= self.ttft_s and tpot_s <= self.itl_s


@dataclass(frozen=True, kw_only=True)
class Workload:
    input_len: LengthDist
    output_len: LengthDist
    rate: float  # requests per second, Poisson
    num_requests: int = 200
    seed: int = 0

    def draw(self, rate: float | None = None) -> list[tuple[float, int, int]]:
        """(arrival s, prompt tokens, output tokens) per request, as bench draws them with the same seed."""
        spec = PhaseSpec(load=Load(max_concurrency=None, request_rate=rate or self.rate),
                         num_requests=self.num_requests, input_len=self.input_len, output_len=self.output_len)
        work = draw_work(spec, random.Random(self.seed))
        return list(zip(work.offsets_s, work.input_lens, work.output_lens))


def make_workload(input_len: str, output_len: str, rate: float, *, num_requests: int = 200,
                  seed: int = 0) -> Workload:
    if not rate > 0:
        raise InputError(f"--rate {rate}: accepted: a positive number of requests per second")
    if num_requests < 10:
        raise InputError(f"--num-requests {num_requests}: accepted: 10 or more (the p90s need them)")
    return Workload(input_len=parse_length(input_len, flag="--input-len"),
                    output_len=parse_length(output_len, flag="--output-len"), rate=rate,
                    num_requests=num_requests, seed=seed)


def make_slo(ttft_s: float, itl_s: float) -> Slo:
    """In seconds (the command line takes milliseconds, as bench's --slo-ttft and --slo-itl do)."""
    for flag, value in (("--slo-ttft", ttft_s), ("--slo-itl", itl_s)):
        if not value > 0:
            raise InputError(f"{flag} {value * 1e3:g}: accepted: a positive number of milliseconds")
    return Slo(ttft_s=ttft_s, itl_s=itl_s)
