"""tune on CPU (tiny grid) writes a valid profile, never picks a wrong backend, and dispatch runs from it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from hybridserve.cli.app import app
from hybridserve.core.common.errors import CouldNotRunError, InputError
from hybridserve.kernels import naive, registry
from hybridserve.kernels.backend_torch import TorchBackend
from hybridserve.kernels.dispatch import Dispatch
from hybridserve.kernels.grid import BatchShape, parse_shape, shapes_from_lengths
from hybridserve.kernels.inputs import GdnShape, make_inputs
from hybridserve.kernels.error_metrics import assert_close
from hybridserve.kernels.summary import summarize
from hybridserve.kernels.tuned_profile import Choice, TunedEntry, TunedProfile, read_profile, write_profile

runner = CliRunner()


class FastButWrong(TorchBackend):
    """Returns zeros at once: the fastest setting by far, and wrong. tune must never choose it."""

    name = "fast-wrong"

    def knob_space(self, shape):
        return [()]

    def prefill(self, q, k, v, g, beta, cu_seqlens, scale=None, initial_state=None, output_final_state=True,
                max_seqlen=None, **knobs):
        n = cu_seqlens.shape[0] - 1
        return torch.zeros_like(v), torch.zeros(n, v.shape[1], k.shape[2], v.shape[2])


@pytest.fixture
def fast_wrong():
    registry.register(FastButWrong())
    yield
    registry.unregister("fast-wrong")


def test_cpu_tune_tiny_grid_profile_is_valid_and_dispatch_uses_it(tmp_path: Path, fast_wrong) -> None:
    out = tmp_path / "cpu.yaml"
    args = ["tune", "--model", "qwen3.5-0.8b", "--tp", "8", "16", "--shapes", "1x64", "2x32", "--reps", "2",
            "--input-sets", "1", "--backend", "torch", "--backend", "fast-wrong", "--out", str(out), "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["device"] == "cpu"
    profile = read_profile(out)
    assert (tmp_path / "cpu.png").stat().st_size > 1000
    assert [(e.tp, e.num_seqs, e.seq_len) for e in profile.entries] == [(8, 1, 64), (8, 2, 32), (16, 1, 64),
                                                                        (16, 2, 32)]
    for e in profile.entries:
        assert e.winner.backend == "torch" and "fast-wrong[default]" in e.rejected
        assert set(e.times_ms) == {"torch[chunk_size=64]", "torch[chunk_size=128]"}
        assert e.winner == e.ranked[0] and e.best_ms == min(e.times_ms.values())
        assert e.fla_ms is None and e.flashinfer_auto_ms is None  # no GPU backends on CPU
    dispatch = Dispatch.from_file(out)
    entry = dispatch.nearest(num_key_heads=2, num_value_heads=2, seqlens=[30, 34])
    assert (entry.tp, entry.num_seqs, entry.seq_len) == (8, 2, 32)
    x = make_inputs(GdnShape(seqlens=(30, 34), num_key_heads=2, num_value_heads=2), seed=5)
    o, state = dispatch.prefill(**x.as_kwargs(), seqlens=[30, 34])
    o_ref, state_ref = naive.gdn_prefill(**x.as_kwargs())
    assert_close(o, o_ref, 2e-2, "o")
    assert_close(state, state_ref, 2e-2, "state")


def entry(num_seqs: int, seq_len: int, ranked: list[Choice], times: list[float], fla: float, fi: float,
          heads=(16, 64)) -> TunedEntry:
    return TunedEntry(tp=1, num_key_heads=heads[0], num_value_heads=heads[1], key_head_dim=128, value_head_dim=128,
                      num_seqs=num_seqs, seq_len=seq_len, winner=ranked[0], winner_ms=times[0], best_ms=min(times),
                      fla_ms=fla, flashinfer_auto_ms=fi, times_ms={c.label: t for c, t in zip(ranked, times)},
                      ranked=tuple(ranked))


FI_AUTO = Choice(backend="flashinfer", knobs=(("use_cp", "auto"),))
FI_NOCP = Choice(backend="flashinfer", knobs=(("use_cp", False),))
FLA = Choice(backend="fla")
TORCH = Choice(backend="torch", knobs=(("chunk_size", 64),))


def synthetic() -> TunedProfile:
    rows = (entry(1, 1024, [FI_NOCP, FI_AUTO, FLA], [0.05, 0.2, 0.5], 0.5, 0.2),
            entry(1, 8192, [FI_AUTO, FI_NOCP, FLA], [0.4, 0.42, 1.0], 1.0, 0.4),
            entry(16, 2048, [FI_AUTO, TORCH, FLA], [0.8, 5.0, 3.2], 3.2, 0.8))
    return TunedProfile(gpu="test", device="cuda", model="m", dtype="bfloat16", created_utc="now", versions={},
                        vllm_gdn_prefill_backend="flashinfer", vllm_setting_geomean_ms={}, timing={}, entries=rows)


# [3000, 0, 0]: empty sequences do not count; 3000 is nearer 8192 than 1024 in log space (1.00 < 1.07).
@pytest.mark.parametrize("seqlens, bucket", [([900], (1, 1024)), ([20000], (1, 8192)), ([2000] * 14, (16, 2048)),
                                             ([3000, 0, 0], (1, 8192))])
def test_nearest_bucket(seqlens, bucket) -> None:
    e = Dispatch(synthetic()).nearest(num_key_heads=16, num_value_heads=64, seqlens=seqlens)
    assert (e.num_seqs, e.seq_len) == bucket


def test_dispatch_falls_back_along_the_ranking_when_a_backend_is_missing_here() -> None:
    choice = Dispatch(synthetic()).choose(num_key_heads=16, num_value_heads=64, seqlens=[2048] * 16)
    assert choice == TORCH  # flashinfer is not importable on this CPU box; torch is next in the ranking
    with pytest.raises(CouldNotRunError, match="1x1024"):
        Dispatch(synthetic()).choose(num_key_heads=16, num_value_heads=64, seqlens=[1000])


def test_dispatch_refuses_heads_it_was_not_tuned_for() -> None:
    with pytest.raises(InputError, match="16/64"):
        Dispatch(synthetic()).choose(num_key_heads=2, num_value_heads=8, seqlens=[100])


def test_profile_roundtrip_and_bad_file(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    write_profile(synthetic(), path)
    assert read_profile(path) == synthetic()
    (tmp_path / "bad.yaml").write_text("entries: 3\n")
    with pytest.raises(InputError, match="bad.yaml"):
        read_profile(tmp_path / "bad.yaml")


def test_summary_numbers() -> None:
    s = summarize(synthetic())
    assert s.speedup_vs_fla == pytest.approx((10 * 2.5 * 4) ** (1 / 3))
    assert s.speedup_vs_flashinfer_auto == pytest.approx((4 * 1 * 1) ** (1 / 3))
    assert s.best_fixed_setting == FI_AUTO.label or s.best_fixed_setting == FLA.label
    assert s.worst_loss_vs_best == 0.0


def test_grid_parsing(tmp_path: Path) -> None:
    assert parse_shape("16x2048") == BatchShape(num_seqs=16, seq_len=2048)
    for bad in ("16*2048", "0x5", "x"):
        with pytest.raises(InputError, match="--shapes"):
            parse_shape(bad)
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("\n".join(str(n) for n in range(100, 10100, 100)))
    shapes = shapes_from_lengths(lengths)
    assert BatchShape(num_seqs=1, seq_len=5120) in shapes and BatchShape(num_seqs=6, seq_len=5120) in shapes


def test_cli_refuses_bad_shape_and_tp() -> None:
    assert runner.invoke(app, ["tune", "--shapes", "big"]).exit_code == 2
    result = runner.invoke(app, ["tune", "--model", "qwen3.5-0.8b", "--tp", "3"])
    assert result.exit_code == 2 and "--tp 3" in result.output


def test_cpu_timing_samples_respect_the_plan() -> None:
    from hybridserve.kernels.timing import TimingPlan, time_calls

    calls_made = []
    samples = time_calls([lambda: calls_made.append(1)], torch.device("cpu"),
                         TimingPlan(num_warmup=2, max_reps=5, min_reps=3))
    assert len(calls_made) == 7 and len(samples.device_ms) == 5 and samples.host_ms == samples.device_ms


@pytest.mark.parametrize("name", ["flashinfer", "flashqla"])
def test_adapters_read_emptiness_once_per_cu_seqlens_object(name: str) -> None:
    from hybridserve.kernels.backend_flashinfer import FlashInferBackend
    from hybridserve.kernels.backend_flashqla import FlashQlaBackend

    b = {"flashinfer": FlashInferBackend, "flashqla": FlashQlaBackend}[name]()
    cu = torch.tensor([0, 3, 3, 5], dtype=torch.int32)
    assert b._prepared(cu).kept.tolist() == [0, 2] and b._prepared(torch.tensor([0, 3, 5])).kept is None
    cu[2] = 4  # not read again: the answer is cached for this object, as fla caches its chunk indices
    assert b._prepared(cu).kept.tolist() == [0, 2]


def test_cpu_tune_without_shapes_uses_the_small_cpu_grid_and_says_so(monkeypatch, tmp_path: Path) -> None:
    import hybridserve.kernels.tune as tune_lib

    seen = {}

    def fake_run_tune(req, progress=None):
        seen["shapes"] = req.shapes
        raise InputError("stop here")

    monkeypatch.setattr(tune_lib, "run_tune", fake_run_tune)
    result = runner.invoke(app, ["tune", "--model", "qwen3.5-0.8b", "--tp", "1", "--out", str(tmp_path / "p.yaml")])
    assert result.exit_code == 2 and "CPU grid 1x512 1x2048 4x512" in result.output
    assert [s.label for s in seen["shapes"]] == ["1x512", "1x2048", "4x512"]
    assert not (tmp_path / "p.yaml").exists()
