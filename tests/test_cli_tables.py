"""Off a terminal (CI logs, `| tee`, `| cat`: here CliRunner's captured stdout) every table keeps every value whole.

rich assumes 80 columns on a pipe; before the consoles fitted tables, tune's and transfer bench's columns all
became "…". Each test renders a command's real table from small real data (library calls patched where they
would run kernels, NIXL or servers) and asserts that no cell was cut and each value appears on one line.
"""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from hybridserve.cli.app import app
from hybridserve.cli.help import HELP_WIDTH

runner = CliRunner()


def _whole(output: str, values) -> None:
    assert "…" not in output, output
    missing = [v for v in values if v not in output]
    assert not missing, f"cut or folded: {missing}\n{output}"


def test_plan_tables_keep_every_value():
    out = runner.invoke(app, ["plan", "-m", "qwen3.5-397b-a17b", "--mamba-ssm-cache-dtype", "bfloat16"])
    assert out.exit_code == 0, out.output
    data = json.loads(runner.invoke(app, ["plan", "-m", "qwen3.5-397b-a17b", "--mamba-ssm-cache-dtype",
                                          "bfloat16", "--json"]).stdout)
    text = json.dumps(data)
    assert "1072" in text and "2195456" in text  # vLLM's own numbers (DESIGN.md); the table must show them whole
    _whole(out.stdout, ["1,072", "2,195,456"])


def test_plan_grid_keeps_every_value():
    out = runner.invoke(app, ["plan", "-m", "all", "--tp", "1", "--tp", "8"])
    assert out.exit_code == 0, out.output
    data = json.loads(runner.invoke(app, ["plan", "-m", "all", "--tp", "1", "--tp", "8", "--json"]).stdout)
    _whole(out.stdout, sorted({d["model"] for d in data}))
    assert max(len(line) for line in out.stdout.splitlines()) > 80  # it did need more than rich's pipe width


def test_tune_table_keeps_every_value(monkeypatch, tmp_path):
    import hybridserve.kernels.tune as tune_lib
    from hybridserve.kernels.tuned_profile import Choice, TunedEntry, TunedProfile

    fi = Choice(backend="flashinfer", knobs=(("use_cp", False), ("chunk_size", 64)))
    fla = Choice(backend="fla")

    def fake_run_tune(req, progress=None):
        entry = TunedEntry(tp=1, num_key_heads=16, num_value_heads=64, key_head_dim=128, value_head_dim=128,
                           num_seqs=4, seq_len=4096, winner=fi, winner_ms=0.123456, best_ms=0.120001,
                           fla_ms=0.456789, flashinfer_auto_ms=0.234567,
                           times_ms={fi.label: 0.123456, fla.label: 0.456789}, ranked=(fi, fla))
        return TunedProfile(gpu="NVIDIA H200", device="cuda", model=req.model.name, dtype="bfloat16",
                            created_utc="2026-12-01T00:00:00Z", versions={}, vllm_gdn_prefill_backend="flashinfer",
                            vllm_setting_geomean_ms={"flashinfer": 0.2}, timing={}, entries=(entry,))

    monkeypatch.setattr(tune_lib, "run_tune", fake_run_tune)
    out = runner.invoke(app, ["tune", "-m", "qwen3.5-397b-a17b", "--tp", "1", "--shapes", "4x4096",
                              "--out", str(tmp_path / "t.yaml")])
    assert out.exit_code == 0, out.output
    _whole(out.stdout, ["16/64", "4x4096", fi.label, "0.123", "0.457", "0.235", "3.70", "1.90", "+0.0%"])


def test_verify_table_keeps_every_value(monkeypatch):
    import hybridserve.kernels.verify as verify_lib
    from hybridserve.core.model.dtypes import DType
    from hybridserve.kernels.verify import CaseResult, Status, VerifyReport

    def fake_run_verify(backends, cases, *, dtype, device, tolerance, progress):
        rows = tuple(CaseResult(backend="flashinfer", knobs="use_cp=False,chunk_size=64", case_id=f"case-{i}",
                                status=Status.PASS, o_error=1.234e-3 * (i + 1), state_error=5.678e-4, tolerance=0.02)
                     for i in range(3))
        return VerifyReport(device="cuda:0 NVIDIA H200", dtype=dtype, results=rows,
                            unavailable=(("cutedsl", "needs a Blackwell GPU (compute capability 10.0)"),))

    monkeypatch.setattr(verify_lib, "run_verify", fake_run_verify)
    out = runner.invoke(app, ["verify", "-b", "torch", "-m", "qwen3.5-0.8b", "--tp", "1"])
    assert out.exit_code == 0, out.output
    _whole(out.stdout, ["flashinfer", "use_cp=False,chunk_size=64", "3.70e-03", "5.68e-04",
                        "needs a Blackwell GPU (compute capability 10.0)"])


def test_transfer_bench_table_keeps_every_value(monkeypatch):
    from hybridserve.transfer import xfer_bench as bench_module
    from hybridserve.transfer.xfer_bench import BenchResult, BenchRow

    row = BenchRow(prompt_tokens=32768, scheme="vllm", allocation="fragmented", num_requests=2,
                   num_descriptors=16260, num_elements=16260, num_merged=None, predicted_descriptors=16260,
                   num_bytes=1_397_391_360, prepare_ms=12.34, post_ms=240.5, transfer_ms=250.7, gbps=5.57,
                   copy_gbps=11.93, is_exact=True)

    def fake(request, *, on_step=None):
        return BenchResult(model=request.model.name, prefill_tp=1, decode_tp=1, memory="dram",
                           backend="flashinfer", block_size=1072, kernel_block_size=16, page_size_bytes=2_195_456,
                           num_tensors=15, rows=(row,))

    monkeypatch.setattr(bench_module, "run_bench", fake)
    out = runner.invoke(app, ["transfer", "bench", "-m", "qwen3.5-397b-a17b", "--prompt-len", "32768"])
    assert out.exit_code == 0, out.output
    _whole(out.stdout, ["32,768", "vllm", "fragmented", "16,260", "1,397.4", "12.34", "240.5", "250.7", "5.57",
                        "11.93", "yes", "page 2,195,456 B x 15 tensors"])


def test_validate_tables_keep_every_value(monkeypatch, tmp_path):
    import hybridserve.core.validate as validate_lib
    from hybridserve.core.deployments.client import Completion
    from hybridserve.core.validate.dataset import AnswerKind, Example
    from hybridserve.core.validate.metrics import compare, summarize
    from hybridserve.core.validate.validation import TargetRun, ValidationReport
    from hybridserve.core.validate.thresholds import Thresholds
    from hybridserve.core.validate.verdict import judge

    ex = Example(prompt="p", answer="a b", answer_kind=AnswerKind.WORDS)
    same = Completion(text="a b", tokens=("a", "b"), logprobs=(-0.1, -0.1), top2_gaps=(5.0, 5.0))
    metrics = summarize([compare(i, ex, same, same, 0.02) for i in range(4)])
    runs = [TargetRun(label=label, url=url, run_dir=tmp_path, schedulers={"decode.log": "AsyncScheduler"},
                      elapsed_s=12.3) for label, url in (("single-sync", "http://127.0.0.1:8100/v1"),
                                                         ("pd-async", "http://127.0.0.1:8000/v1"))]

    def fake_validate(request, on_progress=None):
        return ValidationReport(dataset="synthetic:520-760", verdict=judge(metrics, Thresholds()),
                                comparisons=(), baseline=runs[0], candidate=runs[1], elapsed_s=30.0)

    monkeypatch.setattr(validate_lib, "validate", fake_validate)
    out = runner.invoke(app, ["validate", "--baseline", "http://127.0.0.1:8100", "--candidate",
                              "http://127.0.0.1:8000", "--num-prompts", "4"])
    assert out.exit_code == 0, out.output
    _whole(out.stdout, ["http://127.0.0.1:8100/v1", "http://127.0.0.1:8000/v1", "decode.log: AsyncScheduler",
                        "first-divergence token positions", "divergent prompts (not near-ties)", "<= 0.05"])


def test_launch_dry_run_keeps_every_command_line_whole():
    import shlex

    data = json.loads(runner.invoke(app, ["launch", "--role", "all", "--dry-run", "--json"]).stdout)
    out = runner.invoke(app, ["launch", "--role", "all", "--dry-run"])
    assert out.exit_code == 0, out.output
    assert "…" not in out.stdout
    lines = [line.strip() for line in out.stdout.splitlines()]
    assert len(data["commands"]) == 3
    for command in data["commands"]:
        assert shlex.join(command["argv"]) in lines, f"{command['name']}: command line folded or cut"
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in command["env"].items())
        assert f"{env} \\" in lines, f"{command['name']}: environment folded or cut"


@pytest.mark.parametrize("args", [[], ["plan"], ["tune"], ["verify"], ["launch"], ["validate"], ["transfer"],
                                  ["transfer", "bench"]], ids=lambda a: " ".join(a) or "top")
def test_help_off_a_terminal_keeps_each_option_help_on_one_line(args):
    from hybridserve.cli.app import app as cli

    out = runner.invoke(cli, [*args, "--help"])
    assert out.exit_code == 0, out.output
    assert "…" not in out.stdout
    assert max(len(line) for line in out.stdout.splitlines()) <= HELP_WIDTH
    command = _click_command(cli, args)
    for param in command.params:
        help_text = re.sub(r"\s+", " ", getattr(param, "help", None) or "")
        if help_text:
            assert any(help_text in line for line in out.stdout.splitlines()), f"{param.name}: {help_text!r} folded"


def _click_command(cli, args):
    import typer.main

    command = typer.main.get_command(cli)
    for name in args:
        command = command.commands[name]
    return command
