"""Options shared by commands: `--tp 1 2 4 8` parsed by one helper; --model and --json declared once."""

from __future__ import annotations

import pytest
import typer.main
from typer.testing import CliRunner

from hybridserve.cli.app import app
from hybridserve.cli.options import DEFAULT_TPS, trailing_values
from hybridserve.core.common.errors import InputError

runner = CliRunner()


@pytest.mark.parametrize("tp, extra, takes_shapes, want", [
    (None, [], False, (DEFAULT_TPS, [])),
    ([1], ["2", "4", "8"], False, ((1, 2, 4, 8), [])),
    ([4], [], False, ((4,), [])),
    ([1], ["2", "4x4096", "16X2048"], True, ((1, 2), ["4x4096", "16X2048"])),
    (None, ["1x64"], True, (DEFAULT_TPS, ["1x64"])),
], ids=["default", "verify-list", "one", "tune-tps-and-shapes", "shapes-only"])
def test_trailing_values(tp, extra, takes_shapes, want):
    assert trailing_values(tp, extra, takes_shapes=takes_shapes) == want


@pytest.mark.parametrize("extra, takes_shapes, accepted", [
    (["4x4096"], False, "accepted after --tp: integers"),
    (["two"], True, "accepted after --tp: integers, after --shapes: NxL"),
    (["-1"], False, "accepted after --tp: integers"),
], ids=["shape-in-verify", "word-in-tune", "negative"])
def test_trailing_values_refuses_what_is_not_a_tp_or_shape(extra, takes_shapes, accepted):
    with pytest.raises(InputError, match=f"unexpected argument '{extra[0]}'; {accepted}$"):
        trailing_values([1], extra, takes_shapes=takes_shapes)


class _Stop(InputError):
    pass


def test_verify_and_tune_pass_the_same_tp_list_on(monkeypatch, tmp_path):
    import hybridserve.kernels.cases as cases
    import hybridserve.kernels.tune as tune_lib

    seen = {}

    def fake_case_matrix(*, head_dim, long_len, model, tps):
        seen["verify"] = tps
        raise _Stop("stop here")

    def fake_run_tune(req, progress=None):
        seen["tune"] = req.tps
        seen["shapes"] = [s.label for s in req.shapes]
        raise _Stop("stop here")

    monkeypatch.setattr(cases, "case_matrix", fake_case_matrix)
    monkeypatch.setattr(tune_lib, "run_tune", fake_run_tune)
    out = runner.invoke(app, ["verify", "-m", "qwen3.5-0.8b", "--tp", "1", "2", "4"])
    assert out.exit_code == 2 and "stop here" in out.output
    out = runner.invoke(app, ["tune", "-m", "qwen3.5-0.8b", "--tp", "1", "2", "4", "--shapes", "1x64", "2x32",
                              "--out", str(tmp_path / "t.yaml")])
    assert out.exit_code == 2 and "stop here" in out.output
    assert seen == {"verify": (1, 2, 4), "tune": (1, 2, 4), "shapes": ["1x64", "2x32"]}


def test_verify_refuses_a_shape_after_tp_in_one_line():
    out = runner.invoke(app, ["verify", "-m", "qwen3.5-0.8b", "--tp", "1", "4x4096"])
    assert out.exit_code == 2
    assert out.output.strip() == "error: unexpected argument '4x4096'; accepted after --tp: integers"


def test_model_and_json_options_are_the_shared_ones():
    commands = typer.main.get_command(app).commands
    shared = {name: {p.name: p for p in commands["transfer"].commands["bench"].params}[name]
              for name in ("model", "as_json")}
    for command in ("tune", "verify"):
        params = {p.name: p for p in commands[command].params}
        for name, want in shared.items():
            assert (params[name].opts, params[name].help) == (want.opts, want.help), (command, name)


@pytest.mark.parametrize("args, line, schemes", [
    (["--scheme", "fast"], "error: --scheme fast: accepted: vllm, ours, both", None),
    (["--memory", "hbm"], "error: --memory hbm: accepted: dram, vram", None),
    (["--scheme", " BOTH "], None, ("vllm", "ours")),
    (["--scheme", "Ours", "--memory", "DRAM"], None, ("ours",)),
], ids=["bad-scheme", "bad-memory", "both", "ours"])
def test_transfer_bench_choices_go_through_parse_choice(monkeypatch, args, line, schemes):
    from hybridserve.transfer import xfer_bench as bench_module

    seen = []

    def fake_run_bench(request, *, on_step=None):
        seen.append(request)
        raise _Stop("stop here")

    monkeypatch.setattr(bench_module, "run_bench", fake_run_bench)
    out = runner.invoke(app, ["transfer", "bench", "-m", "qwen3.5-0.8b", *args])
    assert out.exit_code == 2
    if line is not None:
        assert out.output.strip() == line and not seen
    else:
        assert tuple(s.value for s in seen[0].schemes) == schemes and seen[0].memory.value == "dram"
