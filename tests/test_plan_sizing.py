"""`plan --gpus PROFILE:N`: candidates, the recommendation, what is a prediction beyond the profile, refusals, and
no heavy import on its path (a laptop without torch, nixl or vllm plans)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hybridserve.cli.app import app
from hybridserve.core.sizing.step_profile import (EngineLimits, StepCoefficients, StepProfile, TransferCost,
                                                  load_step_profile, write_step_profile)
from hybridserve.core.launch.topology import TINY_MODEL_DIR

runner = CliRunner()
WORKLOAD = ["--input-len", "1000:1800", "--output-len", "16:64", "--rate", "4", "--slo-ttft", "500", "--slo-itl",
            "50", "--num-requests", "60"]


@pytest.fixture()
def profile(tmp_path) -> Path:
    path = tmp_path / "core.yaml"
    write_step_profile(StepProfile(
        name="core", unit="one CPU core", device="cpu", model=str(TINY_MODEL_DIR), tp=1,
        coefficients=StepCoefficients(base_s=0.008, token_s=2e-5, seq_s=2e-4, attention_s=1e-9, http_s=0.003),
        transfer=TransferCost(post_s=0.003, descriptor_s=1e-5, bytes_per_s=2e9),
        limits=EngineLimits(max_num_seqs=8, max_num_batched_tokens=2048, max_model_len=2048), num_blocks=8192,
        measured={"prompt_tokens": [64, 1900], "max_batch": 8}), path)
    return path


def _plan(*args: str):
    return runner.invoke(app, ["plan", "-m", str(TINY_MODEL_DIR), *args])


def test_two_cores_weigh_two_replicas_against_1p1d(profile):
    result = _plan("--gpus", f"{profile}:2", *WORKLOAD, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert {c["name"] for c in data["candidates"]} == {"2 replicas TP1", "1P1D TP1/TP1"}
    assert data["recommended"] == data["candidates"][0]["name"] and data["is_prediction"] is True
    for c in data["candidates"]:
        assert c["num_units"] == 2 and c["ttft_p90_s"] > 0 and c["max_slo_rate"] > 0
        assert c["goodput_per_unit"] == pytest.approx(c["goodput"] / 2)
    assert data["beyond_measured"] == []


def test_a_tp_the_profile_did_not_measure_is_named_a_prediction_beyond_it(profile):
    result = _plan("--gpus", f"{profile}:2", *WORKLOAD, "--tp", "1", "--tp", "2", "--no-search", "--json")
    data = json.loads(result.stdout)
    tp2 = next(c for c in data["candidates"] if c["name"] == "1 replica TP2")
    assert tp2["beyond_measured"] == ["TP2 extrapolated from the TP1 profile"] and tp2["max_slo_rate"] is None
    assert any(c["name"] == "1P1D TP1/TP1" and c["beyond_measured"] == [] for c in data["candidates"])


def test_a_workload_outside_the_measured_lengths_says_so(profile):
    result = _plan("--gpus", f"{profile}:2", "--input-len", "1000:1900", "--output-len", "200", "--rate", "1",
                   "--slo-ttft", "1000", "--slo-itl", "100", "--no-search")
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "plan (a prediction)" in text
    assert "beyond what the profile measured: prompt + output up to 2100 tokens: the measured engines' " \
           "max_model_len is 2048" in text


@pytest.mark.parametrize("args,expected", [
    (["--gpus", "@P:2", "--rate", "1"], "--gpus needs the workload and SLOs: --input-len, --output-len, "
                                             "--slo-ttft, --slo-itl missing"),
    (["--gpus", "h200", *WORKLOAD], "--gpus 'h200': accepted: PROFILE:COUNT"),
    (["--gpus", "no-such-profile:2", *WORKLOAD], "--gpus no-such-profile: no such step profile"),
    (["--gpus", "@P:2", *WORKLOAD[:5], "0", *WORKLOAD[6:]], "--rate 0.0: accepted: a positive number"),
], ids=["no-workload", "no-count", "no-profile", "zero-rate"])
def test_refusals_are_one_line_exit_2(profile, args, expected):
    result = _plan(*[a.replace("@P", str(profile)) for a in args])
    assert result.exit_code == 2, result.output
    assert expected in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_the_profile_round_trips(profile):
    loaded = load_step_profile(profile)
    assert loaded.coefficients.base_s == 0.008 and loaded.limits.max_num_seqs == 8
    assert loaded.measured_prompt_tokens == (64, 1900) and loaded.measured_batch == 8


SIZING_IMPORTS = """
import sys, json
sys.argv = ["hybridserve", "plan", "-m", {model!r}, "--gpus", {gpus!r}, *{workload!r}, "--no-search", "--json"]
from hybridserve.cli.app import main
try:
    main()
except SystemExit as exc:
    heavy = sorted(m for m in ("torch", "nixl", "vllm", "numpy", "fastapi", "httpx") if m in sys.modules)
    print(json.dumps({{"code": exc.code, "heavy": heavy}}), file=sys.stderr)
"""


def test_sizing_imports_no_heavy_package(profile):
    code = SIZING_IMPORTS.format(model=str(TINY_MODEL_DIR), gpus=f"{profile}:2", workload=WORKLOAD)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert json.loads(proc.stderr.strip().splitlines()[-1]) == {"code": 0, "heavy": []}
    assert json.loads(proc.stdout)["recommended"]


@pytest.mark.parametrize("args,expected", [
    ([], "--replica / --steps-from: accepted: one of them"),
    (["--replica", "http://127.0.0.1:1", "--steps-from", "@P"], "--replica / --steps-from: accepted: one of them"),
    (["--steps-from", "@P"], "--steps-from: accepted with --pd or --calibrate"),
    (["--replica", "http://127.0.0.1:1", "--device", "tpu"], "--device tpu: accepted: cpu, cuda"),
    (["--replica", "http://127.0.0.1:1", "--batches", "1,x"], "--batches '1,x': accepted: positive integers"),
], ids=["neither", "both", "steps-alone", "device", "batches"])
def test_step_profile_refusals_are_one_line_exit_2(profile, tmp_path, args, expected):
    result = runner.invoke(app, ["step-profile", "-m", str(TINY_MODEL_DIR), "--out", str(tmp_path / "o.yaml"),
                                 *[a.replace("@P", str(profile)) for a in args]])
    assert result.exit_code == 2, result.output
    assert expected in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "o.yaml").exists()
