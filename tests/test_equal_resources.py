"""benchmarks/equal_resources.py without a GPU: each set's configurations are equal resources as launch reads them
(every engine the same SM share, memory and engine flags, the P/D split aside), and the report puts plan's
prediction beside each measured cell."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from hybridserve.cli.app import app
from hybridserve.core.launch.topology import TINY_MODEL_DIR

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "equal_resources.py"
runner = CliRunner()


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("equal_resources", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _engines(topology_path: Path) -> list[dict]:
    result = runner.invoke(app, ["launch", "--topology", str(topology_path), "--dry-run", "--json",
                                 "--vllm-version", "0.26"])
    assert result.exit_code == 0, result.output
    return [c for c in json.loads(result.stdout)["commands"] if c["role"] != "proxy"]


def _flags(argv: list[str]) -> list[str]:
    skip = {"--host", "--port", "--kv-transfer-config"}
    out, i = [], 3
    while i < len(argv):
        has_value = i + 1 < len(argv) and not argv[i + 1].startswith("--")
        if argv[i] not in skip:
            out += argv[i:i + (2 if has_value else 1)]
        i += 2 if has_value else 1
    return out


@pytest.mark.parametrize("set_name,share", [("1p1d", 50), ("3", 33)])
def test_every_engine_of_a_set_gets_the_same_share_and_flags(script, tmp_path, set_name, share):
    mach = {"device": "cuda", "model": str(TINY_MODEL_DIR), "kv": "4g", "limits": (1024, 8192, 2048)}
    engines = []
    for index, (name, shape) in enumerate(script.SETS[set_name].items()):
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(script.topology(name, shape, mach, 30000 + 1000 * index)))
        found = _engines(path)
        assert len(found) == sum(shape)
        engines += found
    assert {tuple(e["gpus"]) for e in engines} == {(0,)}
    assert {e["env"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] for e in engines} == {str(share)}
    assert len({e["gpu_memory_utilization"] for e in engines}) == 1
    assert {e["argv"][e["argv"].index("--kv-cache-memory-bytes") + 1] for e in engines} == {"4g"}
    assert len({tuple(_flags(e["argv"])) for e in engines}) == 1  # like for like, the P/D split aside
    for e in engines:
        assert ("--kv-transfer-config" in e["argv"]) == (e["role"] != "replica")


def test_on_cpu_1p1d_and_two_replicas_take_cores_0_and_1(script, tmp_path):
    mach = {"device": "cpu", "model": str(TINY_MODEL_DIR), "kv": None, "limits": (8, 2048, 2048)}
    cores = {}
    for index, (name, shape) in enumerate(script.SETS["1p1d"].items()):
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(script.topology(name, shape, mach, 30000 + 1000 * index)))
        cores[name] = [e["share"] for e in _engines(path)]
    assert cores == {"pd-1p1d": ["cores 0", "cores 1"], "replicas-2": ["cores 0", "cores 1"]}


@pytest.mark.parametrize("state", [True, False], ids=["state-given", "default-state"])
def test_the_dry_run_prints_the_launches_and_the_mps_daemon(tmp_path, state):
    argv = [sys.executable, str(SCRIPT), "call", "--set", "3", "--dry-run"] + (["--state", str(tmp_path)] if state
                                                                              else [])
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env={**os.environ, "OUT": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    starts = [line for line in done.stdout.splitlines() if line.startswith("start: ")]
    assert len(starts) == 3 * 4  # per configuration: its three engines, then its proxy
    assert sum("--role replica --index" in line for line in starts) == 3
    assert "nvidia-cuda-mps-control -d" in done.stdout and "echo quit | nvidia-cuda-mps-control" in done.stdout
    assert list(tmp_path.iterdir()) == []  # nothing written, nothing started


def test_the_report_puts_the_prediction_beside_each_measured_cell(script, tmp_path):
    from hybridserve.core.sizing.step_profile import (EngineLimits, StepCoefficients, StepProfile, TransferCost,
                                                      write_step_profile)

    profile = tmp_path / "p.yaml"
    write_step_profile(StepProfile(
        name="p", unit="one CPU core", device="cpu", model=str(TINY_MODEL_DIR), tp=1,
        coefficients=StepCoefficients(base_s=0.01, token_s=2e-5, seq_s=2e-4, attention_s=0.0, http_s=0.003),
        transfer=TransferCost(post_s=0.002), limits=EngineLimits(max_num_seqs=8, max_num_batched_tokens=2048,
                                                                 max_model_len=2048), num_blocks=8192), profile)
    measured = {"goodput": 2.0, "goodput_per_unit": 1.0, "attainment": 1.0, "output_tokens_per_s": 100.0,
                "ttft_p50_s": 0.05, "ttft_p90_s": 0.08, "itl_p50_s": 0.012, "itl_p90_s": 0.015, "wall_s": 20.0}
    worse = {**measured, "goodput": 1.0, "goodput_per_unit": 0.5}
    state = {"set": "1p1d", "device": "cpu", "model": str(TINY_MODEL_DIR), "unit": "one CPU core", "units": 2,
             "workloads": ["chat-cpu"], "rates": {"chat-cpu": [2.0]}, "profile": str(profile),
             "slo": {"chat-cpu": {"ttft_s": 0.5, "itl_s": 0.05}},
             "cells": {"chat-cpu|2.0|replicas-2": {"rc": 0, "measured": measured},
                       "chat-cpu|2.0|pd-1p1d": {"rc": 0, "measured": worse},
                       "chat-cpu|2.0|replicas-2 (A/A)": {"rc": 0, "measured": {**measured, "goodput": 1.9}}}}
    data = script.report(state)
    (row,) = data["rows"]
    assert row["winner_measured"] == "replicas-2" and row["aa_goodput_spread"] == pytest.approx(0.05)
    assert set(row["configs"]) == {"replicas-2", "pd-1p1d"} and row["slo"] == {"ttft_s": 0.5, "itl_s": 0.05}
    for cell in row["configs"].values():
        assert cell["predicted"]["goodput_per_unit"] > 0 and cell["goodput_error"] is not None


def test_the_slo_is_five_times_the_units_idle_latency(script):
    from hybridserve.core.sizing.step_profile import EngineLimits, StepCoefficients, StepProfile, TransferCost

    profile = StepProfile(name="p", unit="u", device="cpu", model="m", tp=1, transfer=TransferCost(), num_blocks=1,
                          coefficients=StepCoefficients(base_s=0.01, token_s=1e-5, seq_s=0.0, attention_s=0.0,
                                                        http_s=0.02),
                          limits=EngineLimits(max_num_seqs=8, max_num_batched_tokens=1000, max_model_len=4096))
    slo = script.slo_of(profile, {"input_len": "100:1800", "output_len": "8:16"})
    # 1,800 tokens in two chunks (1,000 + 800): 0.02 + 2 x 0.01 + 1,800 x 1e-5 = 0.058 s; a decode step 0.01001 s
    assert slo == {"ttft_s": pytest.approx(5 * 0.058), "itl_s": pytest.approx(5 * 0.01001)}


def test_a_new_machine_goes_on_from_a_carried_state(script, tmp_path):
    carried, state_dir = tmp_path / "carried", tmp_path / "state"
    carried.mkdir(), state_dir.mkdir()
    (carried / "equal_resources_state.json").write_text(json.dumps(
        {"set": "1p1d", "profile": "/tmp/hs-equal/1p1d/profile-1p1d.yaml", "cells": {"long|1.0|pd-1p1d": {"rc": 0}}}))
    (carried / "profile-1p1d.yaml").write_text("schema: x\n")
    args = type("Args", (), {"state": state_dir, "resume": carried})()
    state = script.load_state(args, {})
    assert state["profile"] == str(state_dir / "profile-1p1d.yaml") and (state_dir / "profile-1p1d.yaml").is_file()
    assert state["cells"] == {"long|1.0|pd-1p1d": {"rc": 0}}
