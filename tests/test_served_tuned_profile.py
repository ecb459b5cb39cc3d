"""The CPU-testable parts of the H200 kernel benches: the 397B-geometry model maker, the tuned-vs-default serving
comparison (benchmarks/served_tuned_profile.py) and the folded kernel script's arguments
(benchmarks/kernels_h200.py)."""

from __future__ import annotations

import argparse
from dataclasses import replace
import importlib.util
from pathlib import Path

import pytest

from hybridserve.core.model.profiles import load_model
from hybridserve.core.vllm_plugin import switches
from hybridserve.kernels.cases import model_heads

from _gdn_profiles import two_bucket_profile

ROOT = Path(__file__).resolve().parent.parent


def _load(path: str):
    spec = importlib.util.spec_from_file_location(Path(path).stem, ROOT / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = _load("benchmarks/served_tuned_profile.py")
maker = _load("scripts/make_gdn_bench_model.py")


def test_bench_model_has_the_397b_gdn_heads_of_one_rank(tmp_path) -> None:
    pytest.importorskip("transformers")
    out = maker.build(tmp_path / "m", tp=4, num_layers=4, hidden_size=128)
    spec = load_model(str(out))
    assert (spec.gdn.num_key_heads, spec.gdn.num_value_heads) == model_heads(load_model("qwen3.5-397b-a17b"), 4)
    assert (spec.gdn.key_head_dim, spec.gdn.value_head_dim, spec.gdn.conv_kernel) == (128, 128, 4)
    assert not (tmp_path / "m.tmp").exists() and (out / "tokenizer.json").is_file()


@pytest.mark.parametrize("tp, layers, needle", [(3, 4, "--tp 3"), (2, 6, "--layers 6")])
def test_bench_model_refuses_a_tp_or_layer_count_it_cannot_make(tp, layers, needle) -> None:
    with pytest.raises(SystemExit, match=needle):
        maker.geometry(tp, num_layers=layers, hidden_size=128)


def test_prompts_are_deterministic_distinct_and_of_the_asked_lengths() -> None:
    mix = bench.mix_prompts([16, 64], [3, 1])
    assert [len(p) for p in mix] == [16, 16, 16, 64]
    assert len({tuple(p) for p in mix}) == 4 and bench.mix_prompts([16, 64], [3, 1]) == mix
    assert min(min(p) for p in mix) >= 50


def _result(ttft: dict, tok_s: float, greedy: dict) -> dict:
    return {"ttft_median_s": ttft, "throughput": {"prefill_tok_per_s": tok_s}, "greedy_tokens": greedy}


def test_comparison_reports_speedups_and_token_identity() -> None:
    default = _result({"1024": 0.2, "8192": 1.0}, 1000.0, {"1024": ["a", "b"], "8192": ["c"]})
    tuned = _result({"1024": 0.1, "8192": 1.25}, 1250.0, {"1024": ["a", "b"], "8192": ["d"]})
    assert bench.compare(default, tuned) == {
        "ttft_speedup": {"1024": 2.0, "8192": 0.8}, "ttft_never_slower": False, "prefill_throughput_ratio": 1.25,
        "greedy_identical": {"1024": True, "8192": False}}


def test_comparison_bounds_each_ratio_and_names_lengths_slower_beyond_noise() -> None:
    default = _result({"1024": 0.02, "32768": 0.1}, 1000.0, {"1024": ["a"], "32768": ["b"]})
    tuned = _result({"1024": 0.02, "32768": 0.2}, 1000.0, {"1024": ["a"], "32768": ["b"]})
    default["ttft_s"] = {"1024": [0.019, 0.020, 0.021, 0.022, 0.018], "32768": [0.10, 0.11, 0.09, 0.10, 0.10]}
    tuned["ttft_s"] = {"1024": [0.021, 0.018, 0.020, 0.019, 0.022], "32768": [0.20, 0.21, 0.19, 0.20, 0.22]}
    report = bench.compare(default, tuned)
    low, high = report["ttft_speedup_ci95"]["1024"]
    assert low < 1.0 < high  # the same spread on both: the interval straddles 1
    assert report["ttft_speedup_ci95"]["32768"][1] < 0.6  # twice as slow on every sample
    assert report["ttft_slower_beyond_noise"] == ["32768"]
    assert bench.median_ratio_ci([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]) == bench.median_ratio_ci([1.0, 2.0, 3.0],
                                                                                             [1.0, 2.0, 3.0])


def test_bucket_lines_are_cut_from_the_server_log() -> None:
    log = ("INFO 12-01 [x.py:1] hybridserve: GDN prefill bucket TP1 1x16 (heads 2/2) -> torch[chunk_size=64]\n"
           "INFO 12-01 other line\n")
    assert bench.bucket_lines(log) == ["hybridserve: GDN prefill bucket TP1 1x16 (heads 2/2) -> torch[chunk_size=64]"]


def test_the_two_configurations_differ_only_by_the_tuned_profile_ports_and_core(tmp_path) -> None:
    args = argparse.Namespace(model=ROOT / "profiles" / "tiny-qwen3.5-recall", device="cpu", tp=1,
                              lengths=[64, 512], mix=[4, 1], extra_arg=[], base_port=8000, gpu_share=0.4,
                              profile=two_bucket_profile(tmp_path / "p.yaml"), control=False)
    configs = bench.topologies(args)
    assert list(configs) == ["default", "tuned"]
    default, tuned = configs["default"].decode[0], configs["tuned"].decode[0]
    assert switches.GDN_DISPATCH_PROFILE not in dict(default.env)
    assert dict(tuned.env)[switches.GDN_DISPATCH_PROFILE] == str((tmp_path / "p.yaml").resolve())
    assert configs["tuned"].engine == configs["default"].engine and configs["default"].engine.max_model_len == 576
    # side by side: other ports, another core, nothing else
    assert {default.port, default.side_channel_port}.isdisjoint({tuned.port, tuned.side_channel_port})
    assert (default.devices, tuned.devices) == ((0,), (1,))
    assert replace(tuned, port=default.port, side_channel_port=default.side_channel_port, devices=default.devices,
                   env=default.env) == default


def test_measurements_alternate_abba() -> None:
    assert [bench.alternating(["default", "tuned"], i) for i in range(3)] == [
        ["default", "tuned"], ["tuned", "default"], ["default", "tuned"]]


def test_with_a_control_each_server_takes_every_place_equally_often() -> None:
    names = ["default", "tuned", "control"]
    orders = [bench.alternating(names, i) for i in range(6)]
    assert all(sorted(order) == sorted(names) for order in orders)
    assert all(sorted(order[place] for order in orders) == sorted(names * 2) for place in range(3))


def test_the_control_is_the_default_on_other_ports(tmp_path) -> None:
    args = argparse.Namespace(model=ROOT / "profiles" / "tiny-qwen3.5-recall", device="cpu", tp=1,
                              lengths=[64, 512], mix=[4, 1], extra_arg=[], base_port=8000, gpu_share=0.4,
                              profile=two_bucket_profile(tmp_path / "p.yaml"), control=True)
    configs = bench.topologies(args)
    default, control = configs["default"].decode[0], configs["control"].decode[0]
    ports = [{c.decode[0].port, c.decode[0].side_channel_port} for c in configs.values()]
    assert all(a.isdisjoint(b) for i, a in enumerate(ports) for b in ports[i + 1:])
    assert replace(control, port=default.port, side_channel_port=default.side_channel_port) == default


def test_throughput_runs_pool_tokens_over_wall_time() -> None:
    runs = [{"prompt_tokens": 1000, "wall_s": 1.0}, {"prompt_tokens": 1000, "wall_s": 3.0}]
    assert bench.pooled(runs) == {"prompt_tokens": 2000, "wall_s": 4.0, "prefill_tok_per_s": 500.0}


def test_the_kernel_script_has_its_two_modes_and_refuses_none() -> None:
    kernels = _load("benchmarks/kernels_h200.py").parser()
    tune = kernels.parse_args(["tune", "--out", "o", "--tp", "1", "2", "--backends", "flashqla"])
    assert (tune.mode, tune.tp, tune.backends, tune.budget_s) == ("tune", [1, 2], ["flashqla"], 560.0)
    cost = kernels.parse_args(["route-cost", "--profile", "p.yaml", "--out", "c.json"])
    assert (cost.mode, cost.tp, cost.shapes) == ("route-cost", 2, ["1x1024", "1x8192", "4x4096"])
    with pytest.raises(SystemExit):
        kernels.parse_args(["--out", "o"])


@pytest.mark.parametrize("device, cap", [("cuda", None), ("cpu", 8)])
def test_on_cuda_the_servers_take_launchs_own_sequence_cap(tmp_path, monkeypatch, device, cap) -> None:
    """As users serve: no demo cap on CUDA (launch caps by the state blocks a share holds, seqs_fit.py); the CPU
    smoke run keeps a small one."""
    from hybridserve.core.launch import tuned

    monkeypatch.setattr(tuned, "check_tuned_profile", lambda header, device: None)  # no H200 here
    monkeypatch.setattr(bench, "_servable", lambda model, device: model)  # nor a wrapped copy of the model
    args = argparse.Namespace(model=ROOT / "profiles" / "tiny-qwen3.5-recall", device=device, tp=1,
                              lengths=[64, 512], mix=[4, 1], extra_arg=[], base_port=8000, gpu_share=0.4,
                              profile=two_bucket_profile(tmp_path / "p.yaml"), control=True)
    configs = bench.topologies(args)
    assert {c.engine.max_num_seqs for c in configs.values()} == {cap}
