"""`hybridserve transfer bench`: parses, calls run_bench once with the right request, renders table or JSON."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from hybridserve.cli.app import app
from hybridserve.core.layout.attention_backend import AttentionBackend
from hybridserve.core.layout.descriptors import Scheme
from hybridserve.core.model.dtypes import DType
from hybridserve.transfer import xfer_bench as bench_module
from hybridserve.transfer.xfer_bench import BenchResult, BenchRow, Memory

ROW = BenchRow(prompt_tokens=8192, scheme="ours", allocation="fragmented", num_requests=2, num_descriptors=165,
               num_elements=165, num_merged=165, predicted_descriptors=165, num_bytes=349_347_840, prepare_ms=0.1,
               post_ms=60.0, transfer_ms=61.0, gbps=5.7, copy_gbps=12.0, is_exact=True)


@pytest.fixture
def calls(monkeypatch):
    seen = []

    def fake(request, *, on_step=None):
        seen.append(request)
        return BenchResult(model=request.model.name, prefill_tp=request.prefill_tp, decode_tp=request.decode_tp,
                           memory=request.memory.value, backend=request.backend.value, block_size=1072,
                           kernel_block_size=16, page_size_bytes=2_195_456, num_tensors=15, rows=(ROW,))

    monkeypatch.setattr(bench_module, "run_bench", fake)
    return seen


def test_json_carries_the_result_and_the_request_is_parsed_once(calls, tmp_path):
    png = tmp_path / "bench.png"
    out = CliRunner().invoke(app, ["transfer", "bench", "-m", "qwen3.5-397b-a17b", "--prefill-tp", "2",
                                   "--decode-tp", "1", "--prompt-len", "8192", "--scheme", "ours", "--memory", "vram",
                                   "--requests", "3", "--mamba-ssm-cache-dtype", "bf16", "--attention-backend", "fi",
                                   "--json", "--png", str(png)])
    assert out.exit_code == 0, out.output
    (request,) = calls
    assert (request.prefill_tp, request.decode_tp, request.prompt_tokens) == (2, 1, (8192,))
    assert request.schemes == (Scheme.OURS,) and request.memory is Memory.VRAM and request.num_requests == 3
    assert request.ssm_dtype is DType.BFLOAT16 and request.backend is AttentionBackend.FLASHINFER
    data = json.loads(out.stdout)
    assert data["rows"][0]["num_descriptors"] == 165 and data["block_size"] == 1072
    assert png.stat().st_size > 1000


@pytest.mark.parametrize("args, word", [(["--scheme", "fast"], "--scheme fast"), (["--memory", "hbm"], "--memory hbm"),
                                         (["--mamba-ssm-cache-dtype", "int3"], "int3")])
def test_bad_choices_are_refused_in_one_line_with_exit_2(calls, args, word):
    out = CliRunner().invoke(app, ["transfer", "bench", "-m", "qwen3.5-0.8b", *args])
    assert out.exit_code == 2 and word in out.output and "accepted" in out.output
    assert not calls


def test_unequal_block_sizes_are_refused_naming_the_block_size_to_use():
    from hybridserve.core.model.profiles import load_model
    from hybridserve.transfer.xfer_bench import BenchRequest, run_bench

    with pytest.raises(Exception, match="--block-size 1072"):
        run_bench(BenchRequest(model=load_model("qwen3.5-397b-a17b"), prefill_tp=4, decode_tp=2,
                               ssm_dtype=DType.BFLOAT16))
