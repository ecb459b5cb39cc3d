"""Measured against predicted, per cell of an equal-resources sweep (benchmarks/equal_resources.py): a configuration
at a workload and rate as bench measured it, beside plan's simulation of the same requests (same seed, lengths and
arrival times) from the step profile; which configuration won each rate, measured and predicted, and by how much
the predicted goodput missed. The A/A control (the replicas driven twice) gives the measurement's own spread.
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridserve.core.launch.topology import RoutingPolicy
from hybridserve.core.model.spec import ModelSpec
from hybridserve.core.sizing.candidates import Candidate, EngineBuilder
from hybridserve.core.sizing.recommend import predict
from hybridserve.core.sizing.served_stats import ServedStats, from_bench_records, served_stats
from hybridserve.core.sizing.step_profile import StepProfile
from hybridserve.core.sizing.workload import Slo, Workload

GOODPUT_TOLERANCE = 0.2  # plan's goodput within 20 % of the measured one (issue 40)


def candidate_of(shape: tuple[int, int, int], tp: int = 1) -> Candidate:
    """(prefill, decode, replicas) engines -> the candidate plan simulates."""
    prefill, decode, replicas = shape
    if replicas:
        return Candidate(name=f"{replicas} replicas TP{tp}", num_replicas=replicas, replica_tp=tp)
    return Candidate(name=f"{prefill}P{decode}D TP{tp}/TP{tp}", num_prefill=prefill, prefill_tp=tp,
                     num_decode=decode, decode_tp=tp)


def measured_stats(bench_json: dict, slo: Slo, num_units: int) -> ServedStats:
    """bench --json of one phase on one target -> the cell's numbers."""
    records = bench_json["targets"][0]["phases"][0]["records"]
    return served_stats(from_bench_records(records), slo, num_units)


@dataclass(frozen=True, kw_only=True)
class Cell:
    workload: str
    rate: float
    config: str
    measured: ServedStats
    predicted: ServedStats | None

    @property
    def goodput_error(self) -> float | None:
        """(predicted - measured) / measured goodput; None without a prediction or a measured goodput."""
        if self.predicted is None or self.measured.goodput <= 0:
            return None
        return (self.predicted.goodput - self.measured.goodput) / self.measured.goodput


def predict_cell(model: ModelSpec, profile: StepProfile, shape: tuple[int, int, int], workload: Workload,
                 slo: Slo) -> ServedStats:
    builder = EngineBuilder(model, profile)
    return predict(builder, candidate_of(shape, profile.tp), workload, slo, RoutingPolicy.LEAST_OUTSTANDING)[0]


def winner(cells: list[Cell], *, predicted: bool, aa_spread: float = 0.0) -> str | None:
    """The configuration with the most goodput per unit at one (workload, rate); None for a tie within
    `aa_spread` (the A/A control's relative difference: the measurement cannot tell them apart)."""
    def value(c: Cell) -> float:
        stats = c.predicted if predicted else c.measured
        return stats.goodput_per_unit if stats else 0.0

    ranked = sorted(cells, key=value, reverse=True)
    if len(ranked) < 2:
        return ranked[0].config if ranked else None
    best, second = value(ranked[0]), value(ranked[1])
    if best <= 0 or (best - second) / best <= aa_spread:
        return None
    return ranked[0].config
