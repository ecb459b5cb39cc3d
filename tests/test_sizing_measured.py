"""plan against what was measured: the CPU equal-resources run (benchmarks/results/equal_resources_cpu.json, 1P1D
against 2 replicas on this project's 2-core CPU) and the shipped profile it measured (profiles/steps/cpu-core.yaml).
plan, from the shipped profile alone, names the measured winner and comes within 20 % of the measured goodput."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hybridserve.core.model.profiles import load_model
from hybridserve.core.launch.topology import TINY_MODEL_DIR
from hybridserve.core.sizing.compare import GOODPUT_TOLERANCE, predict_cell
from hybridserve.core.sizing.step_profile import load_step_profile
from hybridserve.core.sizing.workload import Slo, make_workload

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "equal_resources_cpu.json"
DATA = json.loads(RESULTS.read_text())
DECIDED = [row for row in DATA["rows"] if row["winner_measured"] is not None]


def _predicted(row: dict, config: str):  # noqa: ANN202 (ServedStats)
    workload = DATA["workloads"][row["workload"]]
    cell = row["configs"][config]
    work = make_workload(workload["input_len"], workload["output_len"], row["rate"], num_requests=cell["num_requests"])
    slo = Slo(ttft_s=row["slo"]["ttft_s"], itl_s=row["slo"]["itl_s"])
    return predict_cell(load_model(str(TINY_MODEL_DIR)), load_step_profile("cpu-core"), tuple(cell["shape"]), work,
                        slo)


def test_the_run_decided_at_least_one_rate():
    assert DECIDED, "every measured rate was a tie within the A/A spread"


@pytest.mark.parametrize("row", DECIDED, ids=[f"{r['workload']}-{r['rate']:g}" for r in DECIDED])
def test_plan_names_the_measured_winner_within_20_percent(row):
    predicted = {config: _predicted(row, config) for config in row["configs"]}
    best = max(predicted, key=lambda c: predicted[c].goodput_per_unit)
    assert best == row["winner_measured"]
    winner = row["configs"][best]["measured"]
    error = abs(predicted[best].goodput - winner["goodput"]) / winner["goodput"]
    assert error <= GOODPUT_TOLERANCE, (best, predicted[best].goodput, winner["goodput"])
