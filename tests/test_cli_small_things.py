"""Small things a newcomer saw: the demo counts words and says so, flags are shown as flags, verify's error columns
hold numbers, and tune refuses an output folder that does not exist instead of creating it."""

from __future__ import annotations

import importlib.util
import io
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from hybridserve.cli.app import app

ROOT = Path(__file__).resolve().parent.parent


def test_the_demo_counts_the_prompt_in_words_and_says_words():
    spec = importlib.util.spec_from_file_location("demo_requests", ROOT / "scripts" / "demo_requests.py")
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    text = "alpha beta gamma delta " * 10 + "omega"
    assert demo.prompt_label(text) == "'alpha beta gamma delta ... beta gamma delta omega' (41 words)"
    assert '"$PY" scripts/demo_requests.py "$PORT"' in (ROOT / "scripts" / "demo.sh").read_text()  # what it runs


@pytest.mark.parametrize("words", [["plan"], ["verify"], ["tune"], ["launch"], ["validate"], ["transfer", "bench"]])
def test_json_is_shown_as_a_flag_without_a_value(words):
    result = CliRunner().invoke(app, [*words, "--help"], env={"COLUMNS": "200"}, terminal_width=200)
    assert result.exit_code == 0
    line = next(line for line in result.output.splitlines() if "--json" in line and "Print" in line)
    assert "<bool>" not in line


def test_verify_keeps_numbers_in_the_error_columns_and_the_reason_below(monkeypatch):
    from hybridserve.cli import verify
    from hybridserve.core.model.dtypes import DType
    from hybridserve.kernels.verify import VerifyReport

    console = Console(file=io.StringIO(), width=200)
    monkeypatch.setattr(verify, "out_console", console)
    report = VerifyReport(device="cpu", dtype=DType.BFLOAT16, results=(),
                          unavailable=(("flashinfer", "needs a CUDA GPU (sm_90)"),))
    verify._render(report)
    lines = console.file.getvalue().splitlines()
    row = next(line for line in lines if "flashinfer" in line and "│" in line)
    cells = [c.strip() for c in row.split("│")[1:-1]]
    assert cells == ["flashinfer", "-", "-", "-", "-", "-", "-"]
    assert "  unavailable flashinfer: needs a CUDA GPU (sm_90)" in lines


def test_tune_refuses_an_output_folder_that_does_not_exist(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    reached = []
    monkeypatch.setattr("hybridserve.kernels.tune.run_tune", lambda *a, **k: reached.append(a))
    out = tmp_path / "nonexistent_dir" / "x.yaml"
    result = CliRunner().invoke(app, ["tune", "--backend", "torch", "--model", "qwen3.5-0.8b", "--tp", "1",
                                      "--out", str(out)])
    assert result.exit_code == 2 and not reached
    assert result.output.strip() == (f"error: --out {out}: folder {out.parent} does not exist; accepted: a file "
                                      f"path in an existing folder (create it first)")
    assert not out.parent.exists()


def test_transfer_bench_vram_without_cuda_is_refused_in_one_line(monkeypatch):
    torch = pytest.importorskip("torch")
    pytest.importorskip("nixl")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    monkeypatch.setattr("hybridserve.transfer.xfer_bench.Cluster", lambda *a, **k: pytest.fail("a rank started"))
    result = CliRunner().invoke(app, ["transfer", "bench", "-m", "qwen3.5-0.8b", "--prompt-len", "256",
                                      "--memory", "vram"])
    assert result.exit_code == 2
    assert result.output.strip() == ("error: --memory vram needs CUDA: torch sees no CUDA GPU on this machine; "
                                      "accepted here: --memory dram")
