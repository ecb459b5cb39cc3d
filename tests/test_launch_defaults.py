"""Issue 38: on CUDA launch leaves vLLM its own defaults (sequences, context, compile and graphs, GDN kernel) unless
asked; the CPU demo keeps its small ones; the context is set (auto) only where plan says the model's own may not fit
the role's memory; the start timeout fits a cold CUDA start."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hybridserve.cli.app import app
from hybridserve.core.host.gpu_memory import gpu_memory_bytes, parse_smi_total
from hybridserve.core.launch.context_fit import HEADROOM, context_fit
from hybridserve.core.launch.instance_cache import instance_cache
from hybridserve.core.launch.topology import Device, EngineInstance, EngineOptions
from hybridserve.core.layout.capacity import MemoryBudget, plan_capacity
from hybridserve.core.model.profiles import load_model
from hybridserve.core.supervise.start_phase import default_start_timeout

runner = CliRunner()
PROFILES = Path(__file__).resolve().parent.parent / "profiles" / "models"
LIMIT_FLAGS = ("--max-num-seqs", "--max-model-len", "--max-num-batched-tokens", "--enforce-eager")


@pytest.fixture(autouse=True)
def no_gpu_here(monkeypatch):
    """A dry run asks the driver for the GPU's memory; these tests decide it (--gpu-memory) or have none."""
    monkeypatch.setattr("hybridserve.core.launch.machine.gpu_memory_bytes", lambda gpu=0: None)


def _engines(args: list[str]) -> list[dict]:
    result = runner.invoke(app, ["launch", "--role", "all", "--dry-run", "--json", *args])
    assert result.exit_code == 0, result.output
    return [c for c in json.loads(result.stdout)["commands"] if c["role"] in ("prefill", "decode")]


def _value(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def _model_folder(tmp_path: Path, profile: str) -> Path:
    """A folder with only the profile's config.json: enough for a dry run."""
    folder = tmp_path / profile
    folder.mkdir()
    shutil.copy(PROFILES / f"{profile}.json", folder / "config.json")
    return folder


def test_cuda_dry_run_leaves_vllm_its_defaults():
    """The issue's acceptance: no sequence cap, no 2,048 context, no eager, no GDN backend on any engine."""
    for c in _engines(["--device", "cuda"]):
        for flag in (*LIMIT_FLAGS, "--gdn-prefill-backend"):
            assert flag not in c["argv"], (c["name"], flag)
        limits = c["limits"]
        assert {k: v["value"] for k, v in limits.items()} == dict.fromkeys(limits)
        assert "vLLM's default" in limits["max_num_seqs"]["reason"]
        assert "not checked against GPU memory" in limits["max_model_len"]["reason"]


def test_cpu_dry_run_keeps_the_demo_defaults():
    for c in _engines([]):
        argv = c["argv"]
        assert (_value(argv, "--max-model-len"), _value(argv, "--max-num-seqs")) == ("2048", "8")
        assert "--enforce-eager" in argv and "--max-num-batched-tokens" not in argv
        assert "the CPU demo's" in c["limits"]["max_num_seqs"]["reason"]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_what_the_operator_asks_is_written_on_either_device(device):
    args = ["--device", device, "--max-num-seqs", "128", "--max-model-len", "8192", "--max-num-batched-tokens",
            "4096", "--enforce-eager", "--gdn-prefill-backend", "triton"]
    if device == "cpu":
        args.remove("--gdn-prefill-backend"), args.remove("triton")
    for c in _engines(args):
        argv = c["argv"]
        assert [_value(argv, f) for f in LIMIT_FLAGS[:3]] == ["128", "8192", "4096"] and "--enforce-eager" in argv
        assert c["limits"]["max_num_seqs"]["reason"] == "asked (--max-num-seqs)"
        if device == "cuda":
            assert _value(argv, "--gdn-prefill-backend") == "triton"


def test_no_enforce_eager_drops_the_flag_on_cpu_too():
    for c in _engines(["--no-enforce-eager"]):
        assert "--enforce-eager" not in c["argv"]
        assert c["limits"]["enforce_eager"]["reason"].startswith("asked (--no-enforce-eager)")


def test_a_topology_file_sets_the_limits(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(textwrap.dedent("""\
        device: cuda
        engine: {max_num_seqs: 64, enforce_eager: false}
        prefill: [{port: 18100, side_channel_port: 18150, devices: [0]}]
        decode: [{port: 18200, side_channel_port: 18250, devices: [0]}]
        """))
    for c in _engines(["--topology", str(path)]):
        assert _value(c["argv"], "--max-num-seqs") == "64" and "--enforce-eager" not in c["argv"]
        assert "--max-model-len" not in c["argv"]


@pytest.mark.parametrize("profile, flag", [("qwen3.5-9b", None), ("qwen3.5-27b", "auto")])
def test_context_is_auto_only_where_plan_says_it_may_not_fit(tmp_path, profile, flag):
    """P and D share one H200 (0.46 each of the 139.8 GiB vLLM sees). 9B: 8.1 GiB a 262,144-token request of ~47.6 GiB
    of KV cache, left alone. 27B (54 GB of bf16 weights): 16.2 GiB of ~14.2 GiB, so vLLM is asked to fit it
    (`--max-model-len auto`)."""
    engines = _engines(["--device", "cuda", "--gpu-memory", "h200", "-m", str(_model_folder(tmp_path, profile))])
    for c in engines:
        assert _value(c["argv"], "--max-model-len") == flag
        reason = c["limits"]["max_model_len"]["reason"]
        assert "262,144 tokens" in reason and "share 0.46 of 140 GiB" in reason
        assert ("plan's longest fit" in reason) is (flag == "auto")


def test_gpu_memory_refuses_what_is_not_a_size():
    result = runner.invoke(app, ["launch", "--role", "all", "--dry-run", "--device", "cuda", "--gpu-memory", "lots"])
    assert result.exit_code == 2 and "--gpu-memory lots: accepted" in result.output


def _layout(profile: str):
    model = load_model(str(PROFILES / f"{profile}.json"))
    return instance_cache(model, Device.CUDA, EngineOptions(), EngineInstance(port=1, side_channel_port=2)).layout


@pytest.mark.parametrize("profile, share", [("qwen3.5-27b", 0.45), ("qwen3.5-27b", 0.2), ("qwen3.5-9b", 0.2)])
def test_longest_fit_is_the_last_length_plans_capacity_holds(profile, share):
    """vLLM's binary search over plan's arithmetic: N fits one request, N + 1 does not (or N is the context)."""
    layout, memory = _layout(profile), 141 * 10**9
    fit = context_fit(layout, memory_bytes=memory, share=share)
    capacity = plan_capacity(layout, MemoryBudget(device_memory_bytes=memory, gpu_memory_utilization=share))
    longest = fit.largest_fit_tokens  # 0: not one token (27B's weights take more than 0.2 of the GPU)
    assert longest == 0 or capacity.blocks_per_request(layout, longest) <= capacity.num_blocks
    assert longest == 262_144 or capacity.blocks_per_request(layout, longest + 1) > capacity.num_blocks
    per_block = layout.page_size_bytes * layout.num_tensors
    assert fit.kv_cache_bytes == capacity.num_blocks * per_block
    assert fit.needs_auto is (fit.request_bytes > HEADROOM * fit.kv_cache_bytes)


def test_context_fit_without_memory_or_context_checks_nothing():
    layout = _layout("qwen3.5-9b")
    assert not context_fit(layout, memory_bytes=None, share=0.9).is_checked
    assert context_fit(layout, memory_bytes=None, share=0.9).needs_auto is False


def test_gpu_memory_probes_in_order_and_smi_is_mib():
    assert gpu_memory_bytes(0, nvml=lambda g: None, smi=lambda g: 7) == 7
    assert gpu_memory_bytes(0, nvml=lambda g: 5, smi=lambda g: 7) == 5
    assert gpu_memory_bytes(0, nvml=lambda g: None, smi=lambda g: None) is None
    assert parse_smi_total("143771\n") == 143771 * 2**20 and parse_smi_total("") is None


def test_help_says_why_cpu_is_small_and_cuda_is_vllms():
    result = runner.invoke(app, ["launch", "--help"], env={"COLUMNS": "200"})
    text = " ".join(result.output.split())
    for words in ("2 cores", "1 GiB of KV cache", "tiny model", "vLLM's own", "CUDA 900", "279 s"):
        assert words in text, words


def test_start_timeout_depends_on_the_device():
    assert default_start_timeout(Device.CUDA) >= 3 * 279 and default_start_timeout(Device.CPU) == 300


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("config", ["single-sync", "pd-async"])
def test_bench_and_validate_start_their_configurations_by_the_same_rules(device, config):
    """validate's and bench's started servers come from launch's plan with the options their CLIs pass when not
    asked (EngineOptions with None): the same limits as `launch` on that device."""
    from hybridserve.core.validate import parse_target
    from hybridserve.core.deployments.target import RECALL_MODEL_DIR
    from hybridserve.core.deployments.deployed import config_plan, config_topology

    target = parse_target(config, what="baseline")
    topology = config_topology(target.config, RECALL_MODEL_DIR, 8000, 2, None, device, EngineOptions())
    for c in config_plan(target.config, topology, is_dry_run=True).commands:
        if c.role.is_engine:
            expected = {"--max-model-len": "2048", "--max-num-seqs": "8"} if device == "cpu" else {}
            assert {f: _value(list(c.argv), f) for f in expected} == expected
            assert ("--enforce-eager" in c.argv) is (device == "cpu")
            if device == "cuda":
                assert not {"--max-num-seqs", "--max-model-len", "--gdn-prefill-backend"} & set(c.argv)


class _Called(Exception):
    pass


@pytest.mark.parametrize("device, start_s", [("cpu", 300.0), ("cuda", 900.0)])
def test_the_clis_leave_engine_options_unset_and_wait_the_devices_start_time(monkeypatch, device, start_s):
    seen = {}

    def fake(request, progress=None):
        seen["request"] = request
        raise _Called

    monkeypatch.setattr("hybridserve.core.bench.comparison.bench", fake)
    monkeypatch.setattr("hybridserve.core.validate.validate", fake)
    for args in (["bench", "--baseline", "none"], ["validate", "--num-prompts", "2"]):
        result = runner.invoke(app, [*args, "--device", device])
        assert isinstance(result.exception, _Called), result.output
        request = seen.pop("request")
        assert request.engine == EngineOptions() and request.start_timeout_s == start_s
    result = runner.invoke(app, ["bench", "--baseline", "none", "--device", device, "--timeout", "42"])
    assert seen["request"].start_timeout_s == 42 and seen["request"].request_timeout_s == 42
