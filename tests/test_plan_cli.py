"""`hybridserve plan`: arguments reach the library as typed values; errors are one line with exit 2."""

import json
import subprocess
import sys
from unittest import mock

import pytest
import yaml
from typer.testing import CliRunner

from hybridserve.cli import plan as plan_cli
from hybridserve.cli.app import app
from hybridserve.core.layout.attention_backend import AttentionBackend
from hybridserve.core.model.dtypes import DType

runner = CliRunner()


def test_arguments_are_parsed_once_and_passed_on():
    with mock.patch.object(plan_cli, "make_plan", wraps=plan_cli.make_plan) as make_plan:
        result = runner.invoke(app, ["plan", "-m", "qwen3.5-397b-a17b", "--tp", "2", "--decode-tp", "2",
                                     "--mamba-ssm-cache-dtype", "bf16", "--attention-backend", "flashinfer",
                                     "--prompt-len", "8192", "--runs", "3", "--memory", "h200", "--json"])
    assert result.exit_code == 0, result.output
    (request,), _ = make_plan.call_args
    assert request.layout.tp == 2 and request.decode_tp == 2
    assert request.layout.ssm_dtype is DType.BFLOAT16 and request.layout.kv_dtype is None
    assert request.layout.backend is AttentionBackend.FLASHINFER
    assert request.prompt_tokens == (8192,) and request.num_runs == 3
    assert request.budget.device_memory_bytes == int(139.8 * 2**30)  # the H200 as vLLM sees it
    data = json.loads(result.stdout)
    # TP2: 1 KV head -> 1,024 B/token; GDN page 36,864 + 1,048,576 -> 16 * cdiv(1,085,440, 16,384) = 1072
    assert data["prefill"]["block_size"] == 1072 and data["decode"]["kernel_block_size"] == 16


def test_json_and_yaml_carry_vllm_numbers():
    args = ["plan", "-m", "qwen3.5-397b-a17b", "--mamba-ssm-cache-dtype", "bfloat16", "--prompt-len", "8192"]
    as_json = json.loads(runner.invoke(app, args + ["--json"]).stdout)
    as_yaml = yaml.safe_load(runner.invoke(app, args + ["--yaml"]).stdout)
    assert as_json == as_yaml
    assert as_json["prefill"]["page_size_bytes"] == 2_195_456
    vllm = as_json["requests"][0]["vllm"]
    # ids handed to NIXL: 15 tensors x 8 blocks of one kernel block + 12 GDN pieces per tensor; NIXL merges the
    # attention run (one request on a fresh server, after one warm-up: its blocks come back descending) ...
    assert (vllm["total_descriptors"], vllm["unmerged_descriptors"]) == (15 * 8 + 180, 15 * 8 + 180)
    assert vllm["contiguous_descriptors"] == 15 + 180 and vllm["fragmented_descriptors"] == 15 * 8 + 180
    # ... in the served scenario: warm-up ascending, then 8 runs (descending), 1 (ascending again), 8: the mean
    assert vllm["served_descriptors"] == 15 * (8 + 1 + 8) / 3 + 180 == 265
    assert as_json["served_scenario"] == {"num_warmup": 1, "repeats": 3, "output_tokens": 16}


def test_grid_over_all_profiles_in_one_call():
    data = json.loads(runner.invoke(app, ["plan", "-m", "all", "--tp", "1", "--tp", "8", "--json"]).stdout)
    assert len(data) == 10 * 2
    assert {d["model"] for d in data} >= {"qwen3.5-0.8b", "gemma-3-4b-it"}


@pytest.mark.parametrize("args, needle", [
    (["-m", "nosuch"], "--model nosuch"),
    (["-m", "qwen3.5-27b", "--tp", "3"], "--tp 3"),
    (["-m", "qwen3.5-27b", "--prompt-len", "-5"], "--prompt-len -5"),
    (["-m", "qwen3.5-27b", "--kv-cache-dtype", "int3"], "int3"),
    (["-m", "qwen3.5-27b", "--attention-backend", "xformers"], "--attention-backend xformers"),
    (["-m", "qwen3.5-27b", "--memory", "tpu"], "--memory tpu"),
    (["-m", "qwen3.5-0.8b", "--decode-tp", "4", "--block-size", "128"], "accepted: --block-size 640"),
    (["-m", "qwen3.5-27b", "--tp", "x"], "'--tp'"),
], ids=["unknown-model", "tp", "negative-length", "dtype", "backend", "memory", "hetero-blocks", "not-int"])
def test_bad_input_is_one_line_exit_2_no_traceback(args, needle):
    proc = subprocess.run([sys.executable, "-c", "from hybridserve.cli.app import main; main()", "plan", *args],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_broken_config_file_is_refused(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("model_type: [")
    result = runner.invoke(app, ["plan", "-m", str(bad)])
    assert result.exit_code == 2 and "not valid JSON" in result.output
