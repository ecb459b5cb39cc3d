"""One engine's serving settings, read from what the engine and its launch left readable (pure parsers).

The settings bench compares (likeness.py) and where each comes from, best first:
- the engine's log, for servers launched by hybridserve (its run folder): vLLM's "Initializing a V1 LLM engine ...
  with config:" line (`dtype=`, `max_seq_len=`, `enforce_eager=`, `kv_cache_dtype=`: VllmConfig.__str__, 0.26 and
  0.32), vLLM's "Using <kernel> GDN prefill kernel" line (qwen_gdn_linear_attn.py) and the plugin's
  "hybridserve: engine scheduler <class> (async_scheduling=...)" line;
- `/metrics`: `vllm:cache_config_info`, a gauge whose labels are every CacheConfig field (v1/metrics/loggers.py
  `log_metrics_info`, the only *_info gauge besides LoRA's in 0.26 and 0.32): gpu_memory_utilization,
  kv_cache_memory_bytes (set on CPU from VLLM_CPU_KVCACHE_SPACE; then the share is not used), cache_dtype,
  mamba_cache_dtype, mamba_ssm_cache_dtype;
- `/v1/models`: the model card's max_model_len;
- the command line launch gave it (plan.json): what was asked, and DEFAULT where launch wrote no flag.
vLLM exports no max-num-seqs, eager or async setting: for a server bench did not see launched they stay unread.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from dataclasses import dataclass, field
from hybridserve.core.launch.seqs_fit import kv_cache_flag  # launch's own reading of the flag (the last, = form)

DEFAULT = "vLLM's default"  # launch wrote no flag: vLLM decides (equal to another DEFAULT, unknown beside a value)


class Setting(enum.Enum):
    MAX_NUM_SEQS = "max-num-seqs"
    MAX_MODEL_LEN = "max-model-len"
    MEMORY = "memory"  # GPU memory share per GPU, or the KV cache bytes of each engine
    EAGER = "enforce-eager"  # on: no torch.compile / CUDA graphs
    GDN_PREFILL = "gdn-prefill-backend"
    ASYNC = "async-scheduling"
    DTYPE = "dtype"
    KV_DTYPE = "kv-cache-dtype"
    CONV_DTYPE = "mamba-cache-dtype"
    SSM_DTYPE = "mamba-ssm-cache-dtype"


@dataclass(frozen=True, kw_only=True)
class Memory:
    """An engine's memory: a share of each of its GPUs, or a fixed KV cache size (kv_cache_memory_bytes)."""

    share: float | None = None
    kv_cache_bytes: int | None = None
    gpus: tuple[int, ...] | None = None  # the GPU ids the share applies to; None: not known


@dataclass(frozen=True, kw_only=True)
class Reading:
    value: str | Memory
    source: str  # "log", "metrics", "models", "launch flags"


@dataclass(frozen=True, kw_only=True)
class EngineSettings:
    name: str  # "decode-0", or the URL of an engine bench found behind a proxy
    readings: dict[Setting, Reading] = field(default_factory=dict)

    def merged(self, other: dict[Setting, Reading]) -> EngineSettings:
        """These readings, with `other`'s for the settings not read yet (callers go best source first)."""
        return EngineSettings(name=self.name, readings={**other, **self.readings})


def _dtype(text: str) -> str:
    return text.strip().removeprefix("torch.")


_CONFIG_FIELDS = {"dtype": (Setting.DTYPE, _dtype), "max_seq_len": (Setting.MAX_MODEL_LEN, str),
                  "enforce_eager": (Setting.EAGER, lambda v: "on" if v == "True" else "off"),
                  "kv_cache_dtype": (Setting.KV_DTYPE, _dtype)}
_CONFIG = re.compile(r"\b(dtype|max_seq_len|enforce_eager|kv_cache_dtype)=([^,\s]+)")
_GDN = re.compile(r"Using (\S+) GDN prefill kernel")
_GDN_NAMES = {"flashinfer": "flashinfer", "cutedsl": "cutedsl", "triton/fla": "triton", "cpu": "cpu (vllm-cpu)"}
_SCHEDULER = re.compile(r"hybridserve: engine scheduler \S+ \(async_scheduling=(True|False)\)")


def from_log(text: str) -> dict[Setting, Reading]:
    """The last start's values in an engine log (a restarted role appends to its log)."""
    out: dict[Setting, Reading] = {}
    for line in text.splitlines():
        if "with config:" in line:
            seen: set[str] = set()
            for key, value in _CONFIG.findall(line.split("with config:", 1)[1]):
                if key not in seen:  # the first of each: VllmConfig's own field, not one inside a nested repr
                    seen.add(key)
                    setting, convert = _CONFIG_FIELDS[key]
                    out[setting] = Reading(value=convert(value), source="log")
        elif (gdn := _GDN.search(line)) is not None:
            out[Setting.GDN_PREFILL] = Reading(value=_GDN_NAMES.get(gdn.group(1).lower(), gdn.group(1)), source="log")
        elif (found := _SCHEDULER.search(line)) is not None:
            out[Setting.ASYNC] = Reading(value="on" if found.group(1) == "True" else "off", source="log")
    return out


_INFO = re.compile(r"^vllm:cache_config_info\{(.*)\}\s", re.MULTILINE)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def cache_config_labels(metrics_text: str) -> dict[str, str] | None:
    """The labels of the first engine's `vllm:cache_config_info` series; None when /metrics has none."""
    found = _INFO.search(metrics_text)
    return dict(_LABEL.findall(found.group(1))) if found else None


def from_cache_config(labels: dict[str, str]) -> dict[Setting, Reading]:
    out: dict[Setting, Reading] = {}
    for label, setting in (("cache_dtype", Setting.KV_DTYPE), ("mamba_cache_dtype", Setting.CONV_DTYPE),
                           ("mamba_ssm_cache_dtype", Setting.SSM_DTYPE)):
        if labels.get(label) not in (None, "None"):
            out[setting] = Reading(value=_dtype(labels[label]), source="metrics")
    kv_bytes, share = labels.get("kv_cache_memory_bytes"), labels.get("gpu_memory_utilization")
    if kv_bytes not in (None, "None"):
        out[Setting.MEMORY] = Reading(value=Memory(kv_cache_bytes=int(kv_bytes)), source="metrics")
    elif share not in (None, "None"):
        out[Setting.MEMORY] = Reading(value=Memory(share=float(share)), source="metrics")
    return out


def from_model_card(max_model_len: int | None) -> dict[Setting, Reading]:
    return {} if max_model_len is None else {Setting.MAX_MODEL_LEN: Reading(value=str(max_model_len),
                                                                            source="models")}


_FLAGS = {"--max-num-seqs": Setting.MAX_NUM_SEQS, "--max-model-len": Setting.MAX_MODEL_LEN,
          "--gdn-prefill-backend": Setting.GDN_PREFILL, "--dtype": Setting.DTYPE, "--kv-cache-dtype": Setting.KV_DTYPE,
          "--mamba-cache-dtype": Setting.CONV_DTYPE, "--mamba-ssm-cache-dtype": Setting.SSM_DTYPE}
_ABSENT = {Setting.EAGER: "off", Setting.KV_DTYPE: "auto"}  # vLLM's fixed defaults (enforce_eager False)


def from_launch(argv: list[str] | tuple[str, ...], env: dict[str, str]) -> dict[Setting, Reading]:
    """From the command line and environment launch gave the engine (launch writes `--flag value` pairs)."""
    argv = list(argv)

    def flag(name: str) -> str | None:
        return argv[argv.index(name) + 1] if name in argv[:-1] else None

    values: dict[Setting, str] = {s: _ABSENT.get(s, DEFAULT) for s in Setting if s is not Setting.MEMORY}
    for name, setting in _FLAGS.items():
        if (value := flag(name)) is not None:
            values[setting] = value
    if "--enforce-eager" in argv:
        values[Setting.EAGER] = "on"
    for name, state in (("--async-scheduling", "on"), ("--no-async-scheduling", "off")):
        if name in argv:
            values[Setting.ASYNC] = state
    out = {s: Reading(value=v, source="launch flags") for s, v in values.items()}

    memory = _launched_memory(flag("--gpu-memory-utilization"), kv_cache_flag(tuple(argv)), env)
    if memory is not None:
        out[Setting.MEMORY] = Reading(value=memory, source="launch flags")
    return out


def _launched_memory(share: str | None, kv_bytes: int | None, env: dict[str, str]) -> Memory | None:
    if env.get("VLLM_CPU_KVCACHE_SPACE"):  # vllm-cpu: GiB of KV cache, exactly (instance_cache.py)
        return Memory(kv_cache_bytes=int(float(env["VLLM_CPU_KVCACHE_SPACE"]) * 2**30))
    if kv_bytes is not None:  # vLLM sizes no KV cache from the share then (its --kv-cache-memory-bytes)
        return Memory(kv_cache_bytes=kv_bytes, gpus=engine_gpus(env))
    if share is None:
        return None
    return Memory(share=float(share), gpus=engine_gpus(env))


def with_gpus(settings: EngineSettings, gpus: tuple[int, ...] | None) -> EngineSettings:
    """`settings` with its memory placed on `gpus` (launch's CUDA_VISIBLE_DEVICES), whichever source read the memory:
    /metrics gives an engine's KV cache size but not where it lives."""
    reading = settings.readings.get(Setting.MEMORY)
    if gpus is None or reading is None or not isinstance(reading.value, Memory) or reading.value.gpus is not None:
        return settings
    placed = Reading(value=dataclasses.replace(reading.value, gpus=gpus), source=reading.source)
    return EngineSettings(name=settings.name, readings={**settings.readings, Setting.MEMORY: placed})


def engine_gpus(env: dict[str, str]) -> tuple[int, ...] | None:
    """The GPU ids a launched CUDA engine runs on (CUDA_VISIBLE_DEVICES, which launch sets); None on CPU."""
    visible = env.get("CUDA_VISIBLE_DEVICES")
    return tuple(int(g) for g in visible.split(",")) if visible else None
