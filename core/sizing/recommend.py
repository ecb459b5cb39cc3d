"""`plan`'s sizing: for a workload, SLOs and N GPUs (a step profile and a count), every candidate deployment
simulated at the workload's rate, and the most it can take: the highest arrival rate at which it still meets the
SLO (DistServe's goodput, found by bisection). The recommendation is the candidate that meets the SLO at the
workload's rate with the most headroom; if none does, the one with the most goodput, said so.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hybridserve.core.common.errors import InputError
from hybridserve.core.launch.topology import RoutingPolicy
from hybridserve.core.model.spec import ModelSpec
from hybridserve.core.sizing.candidates import Candidate, EngineBuilder, enumerate_candidates
from hybridserve.core.sizing.served_stats import ServedStats, from_simulation, served_stats
from hybridserve.core.sizing.simulate import simulate
from hybridserve.core.sizing.step_profile import StepProfile
from hybridserve.core.sizing.workload import Slo, Workload

SEARCH_STEPS = 7  # bisection steps of the highest rate meeting the SLO (1/128 of the first bracket)


@dataclass(frozen=True, kw_only=True)
class SizingRequest:
    model: ModelSpec
    profile: StepProfile
    num_units: int  # GPUs (or GPU shares, or cores) of the profile's unit
    workload: Workload
    slo: Slo
    tps: tuple[int, ...] = ()  # TP sizes to weigh; (): the profile's own
    policy: RoutingPolicy = RoutingPolicy.LEAST_OUTSTANDING
    is_searching: bool = True  # find each candidate's highest rate meeting the SLO


@dataclass(frozen=True, kw_only=True)
class CandidateResult:
    candidate: Candidate
    at_rate: ServedStats
    max_slo_rate: float | None  # requests/s; None: not searched
    num_preemptions: int
    beyond_measured: tuple[str, ...]  # why this is a prediction beyond the profile's measurements ((): inside)


@dataclass(frozen=True, kw_only=True)
class Sizing:
    request: SizingRequest
    results: tuple[CandidateResult, ...]  # best first
    skipped: tuple[tuple[str, str], ...]  # (candidate, why it cannot run)
    workload_notes: tuple[str, ...]  # where the workload lies outside what the profile measured

    @property
    def recommended(self) -> CandidateResult:
        return self.results[0]


def predict(builder: EngineBuilder, candidate: Candidate, workload: Workload, slo: Slo,
            policy: RoutingPolicy, rate: float | None = None) -> tuple[ServedStats, int]:
    deployment = builder.deployment(candidate, policy)
    result = simulate(deployment, workload.draw(rate))
    return served_stats(from_simulation(result), slo, candidate.num_units), result.num_preemptions


def max_slo_rate(builder: EngineBuilder, candidate: Candidate, workload: Workload, slo: Slo,
                 policy: RoutingPolicy) -> float:
    """The highest arrival rate (bisection) at which at least `slo.attainment` of the requests meet both SLOs;
    0.0 when even a trickle does not."""
    def meets(rate: float) -> bool:
        return predict(builder, candidate, workload, slo, policy, rate)[0].is_slo_met

    low, high = 0.0, workload.rate
    while meets(high):
        low, high = high, high * 2
        if high > 1e6:
            return low
    if low == 0.0:
        trickle = workload.rate / 64
        if not meets(trickle):
            return 0.0
        low = trickle
    for _ in range(SEARCH_STEPS):
        middle = (low + high) / 2
        low, high = (middle, high) if meets(middle) else (low, middle)
    return low


def size(request: SizingRequest) -> Sizing:
    builder = EngineBuilder(request.model, request.profile)
    tps = request.tps or (request.profile.tp,)
    results, skipped = [], []
    for candidate in enumerate_candidates(request.num_units, tps):
        try:
            stats, preemptions = predict(builder, candidate, request.workload, request.slo, request.policy)
        except InputError as exc:
            skipped.append((candidate.name, str(exc)))
            continue
        top = max_slo_rate(builder, candidate, request.workload, request.slo, request.policy) \
            if request.is_searching else None
        results.append(CandidateResult(candidate=candidate, at_rate=stats, max_slo_rate=top,
                                       num_preemptions=preemptions,
                                       beyond_measured=tuple(builder.beyond_measured(candidate))))
    if not results:
        raise InputError(f"--gpus: no deployment of {request.num_units} unit(s) at TP {tps} runs this model: "
                         + "; ".join(f"{n}: {why}" for n, why in skipped))
    results.sort(key=lambda r: (r.at_rate.is_slo_met, r.max_slo_rate or 0.0, r.at_rate.goodput), reverse=True)
    notes = workload_notes(request.profile, request.workload)
    measured_with = Path(request.profile.model).name
    if measured_with.lower() != request.model.name.lower():
        notes.insert(0, f"step times measured with {measured_with}, not {request.model.name} (its layout is "
                        f"{request.model.name}'s, its step costs are {measured_with}'s)")
    return Sizing(request=request, results=tuple(results), skipped=tuple(skipped), workload_notes=tuple(notes))


def workload_notes(profile: StepProfile, workload: Workload) -> list[str]:
    notes = []
    span = profile.measured_prompt_tokens
    if span and (workload.input_len.min_tokens < span[0] or workload.input_len.max_tokens > span[1]):
        notes.append(f"prompts {workload.input_len} tokens: the profile measured {span[0]}-{span[1]}")
    longest = workload.input_len.max_tokens + workload.output_len.max_tokens
    if longest > profile.limits.max_model_len:
        notes.append(f"prompt + output up to {longest} tokens: the measured engines' max_model_len is "
                     f"{profile.limits.max_model_len}")
    return notes
