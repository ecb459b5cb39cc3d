"""`plan` and `launch --dry-run` describe the same deployment: one seam from settings to the layout (issue 11).

For every shipped profile at TP 1 and 2, launch's per-role layout (what it passes to vLLM) must equal what
`hybridserve plan` prints for the same settings: block size, page size, kernel block and, on CPU, the number of
blocks in VLLM_CPU_KVCACHE_SPACE (plan: --memory <GiB> --gpu-memory-utilization 1 --weights-gib 0).
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from hybridserve.cli.app import app
from hybridserve.core.common.errors import InputError
from hybridserve.core.launch.launch_plan import Role, make_launch_plan
from hybridserve.core.launch.topology import Device, EngineOptions, TINY_MODEL_DIR, local_topology
from hybridserve.core.model.profiles import MODELS_DIR, model_profile_names

PROFILES = [*model_profile_names(), "tiny-qwen3.5", "tiny-qwen3.5-recall"]


def _model_path(name: str):
    return TINY_MODEL_DIR.parent / name if name.startswith("tiny-") else MODELS_DIR / f"{name}.json"


def _launch(name: str, tp: int, device: Device, engine: EngineOptions):
    topology = local_topology(model=_model_path(name), device=device, engine=engine)
    topology = replace(topology, prefill=(replace(topology.prefill[0], tp=tp),),
                       decode=(replace(topology.decode[0], tp=tp),))
    return make_launch_plan(topology, Role.ALL, python="python3")


def _plan(name: str, tp: int, backend: str, engine: EngineOptions) -> dict:
    args = ["plan", "-m", str(_model_path(name)), "--tp", str(tp), "--attention-backend", backend,
            "--dtype", engine.dtype.value, "--mamba-ssm-cache-dtype", engine.ssm_dtype.value,
            "--mamba-cache-dtype", engine.conv_dtype.value, "--prompt-len", "1024",
            "--memory", str(engine.cpu_kv_cache_gib), "--gpu-memory-utilization", "1", "--weights-gib", "0", "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.parametrize("tp", [1, 2], ids=["tp1", "tp2"])
@pytest.mark.parametrize("device,backend", [(Device.CPU, "cpu_attn"), (Device.CUDA, "flash_attn")],
                         ids=["cpu", "cuda"])
@pytest.mark.parametrize("name", PROFILES)
def test_launch_dry_run_layout_equals_plan(name, tp, device, backend):
    engine = EngineOptions()
    try:
        launch = _launch(name, tp, device, engine)
    except InputError as exc:  # TP does not divide the heads: plan must refuse it too
        result = CliRunner().invoke(app, ["plan", "-m", str(_model_path(name)), "--tp", str(tp)])
        assert result.exit_code == 2 and str(tp) in result.output, (exc, result.output)
        return
    plan = _plan(name, tp, backend, engine)
    for command in launch.commands[:2]:
        layout = command.cache.layout
        assert (layout.block_size, layout.page_size_bytes, layout.kernel_block_size) == (
            plan["prefill"]["block_size"], plan["prefill"]["page_size_bytes"], plan["prefill"]["kernel_block_size"])
        assert f"--block-size {layout.block_size}" in " ".join(command.argv)
        if device is Device.CPU:
            assert command.cache.capacity.num_blocks == plan["capacity"]["num_blocks"]


def test_kv_dtype_and_speculative_tokens_reach_vllm_and_the_layout():
    engine = EngineOptions(kv_cache_dtype=None, num_speculative_tokens=2)
    base = _launch("qwen3.5-0.8b", 1, Device.CUDA, EngineOptions())
    spec = _launch("qwen3.5-0.8b", 1, Device.CUDA, engine)
    argv = " ".join(spec.commands[0].argv)
    assert '--speculative-config {"method":"mtp","num_speculative_tokens":2}' in argv
    # 1 + 2 conv rows per GDN layer: a bigger GDN page, so a bigger (or equal) block
    assert spec.commands[0].cache.layout.gdn.conv_state_bytes > base.commands[0].cache.layout.gdn.conv_state_bytes
    from hybridserve.core.model.dtypes import DType
    fp8 = _launch("qwen3.5-0.8b", 1, Device.CUDA, EngineOptions(kv_cache_dtype=DType.FP8_E4M3))
    assert "--kv-cache-dtype fp8_e4m3" in " ".join(fp8.commands[0].argv)
    assert fp8.commands[0].cache.layout.attention.bytes_per_token * 2 == \
        base.commands[0].cache.layout.attention.bytes_per_token
