"""`launch`: from a topology and a role selection to the exact command line + environment of each role.

Pure: nothing is started and nothing is checked against the machine here (preflight.py does that). The same
LaunchPlan drives `--dry-run`, `--json` and the process runner.
"""

from __future__ import annotations

import enum
import sys
from dataclasses import dataclass
from pathlib import Path

from hybridserve.core.common.choices import parse_choice
from hybridserve.core.common.contracts import WARM_FILE
from hybridserve.core.common.errors import InputError
from hybridserve.core.host.vllm_version import V0_32, VllmFeatures
from hybridserve.core.launch import keys
from hybridserve.core.launch.async_default import AsyncScheduling, resolve as resolve_async
from hybridserve.core.launch.context_fit import context_fit
from hybridserve.core.launch.engine_command import engine_argv, engine_env, guard_flags
from hybridserve.core.launch.engine_limits import EngineLimits, resolve_limits
from hybridserve.core.launch.instance_cache import InstanceCache, instance_cache
from hybridserve.core.launch.mps import check_shares, share_line
from hybridserve.core.launch.placement import EnginePlacement, placements
from hybridserve.core.launch.port_numbers import check_port_numbers
from hybridserve.core.launch.replicas import KIND as REPLICA, check_shape
from hybridserve.core.launch.router_command import metrics_port, router_argv
from hybridserve.core.launch.seqs_fit import seqs_fit
from hybridserve.core.launch.topology import Device, EngineInstance, ProxyKind, Topology
from hybridserve.core.launch.warmup import WarmupBurst, is_on as is_warmup_on, warmup_burst
from hybridserve.core.model.profiles import load_model

PROXY_MODULE = "hybridserve.core.proxy"


class Role(enum.Enum):
    PREFILL = "prefill"
    DECODE = "decode"
    PROXY = "proxy"
    ALL = "all"  # every engine of the topology (prefill + decode, or the replicas) + proxy
    SINGLE = "single"  # one plain vLLM server, no KV connector (validate's baseline)
    REPLICA = "replica"  # a plain vLLM server of an aggregated topology (replicas.py)

    @property
    def is_engine(self) -> bool:
        """Whether a command of this role is a vLLM server (its log shows the engine, its ports include NIXL's)."""
        return self in (Role.PREFILL, Role.DECODE, Role.REPLICA, Role.SINGLE)

    @classmethod
    def parse(cls, text: str) -> Role:
        return parse_choice(cls, text, what="--role")


@dataclass(frozen=True, kw_only=True)
class RoleCommand:
    name: str  # "prefill-0", "decode-0", "proxy": also the log file's stem
    role: Role
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]  # only what launch sets; the rest is inherited
    secret_env: tuple[tuple[str, Path], ...] = ()  # variables read from a key file when the role starts (keys.py):
    # never in `env`, so never in the dry run or plan.json; a relative path is inside the run folder
    host: str
    port: int
    side_channel_port: int | None = None
    metrics_port: int | None = None  # vllm-router: its Prometheus listener (ours serves /metrics on `port`)
    cache: InstanceCache | None = None  # engines only
    gpus: tuple[int, ...] | None = None  # CUDA engines: the GPU ids it runs on
    gpu_memory_utilization: float | None = None  # CUDA engines: its share of each of those GPUs
    sm_percent: int | None = None  # CUDA engines under MPS: its share of the SMs (mps.py)
    share: str | None = None  # engines: what of the machine it gets, in words (mps.share_line)
    async_scheduling: AsyncScheduling | None = None  # engines: on or off, and why (async_scheduling.py)
    limits: EngineLimits | None = None  # engines: context, sequences, eager, and why (engine_limits.py)
    warmup: WarmupBurst | None = None  # engines: the burst sent once healthy, before it counts as serving (warmup.py)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


@dataclass(frozen=True, kw_only=True)
class LaunchPlan:
    topology: Topology
    role: Role
    index: int | None
    caches: tuple[tuple[str, InstanceCache], ...]  # every engine of the topology, for preflight
    commands: tuple[RoleCommand, ...]  # what this host starts, engines first, proxy last
    vllm: VllmFeatures = V0_32  # whose command line the engines got
    warnings: tuple[str, ...] = ()  # one line each, shown before anything starts
    engine_key_file: Path | None = None  # the engines' key (keys.py); relative: generated into the run folder

    @property
    def is_open(self) -> bool:
        """No front key: the proxy answers anyone who reaches it."""
        return self.topology.proxy.api_key_file is None

    def command(self, name: str) -> RoleCommand:
        return next(c for c in self.commands if c.name == name)


def make_launch_plan(topology: Topology, role: Role, *, index: int | None = None, python: str | None = None,
                     vllm: VllmFeatures = V0_32, warnings: tuple[str, ...] = (),
                     gpu_memory_bytes: int | None = None, gpu_name: str | None = None) -> LaunchPlan:
    """`gpu_memory_bytes`: one GPU's memory (CUDA), for each engine's context and state-block checks (context_fit.py,
    seqs_fit.py); None: not checked. `gpu_name`: its name (vLLM's defaults differ for an A100); None: not known."""
    python = python or sys.executable
    check_shape(topology)
    check_shares(topology)
    check_port_numbers(topology)
    model = load_model(str(topology.model))
    engines = _single_engine(topology) if role is Role.SINGLE else _engines(topology)
    caches = tuple((name, _cache(name, model, topology, inst)) for name, _, inst in engines)
    cache_of = dict(caches)
    place = placements(topology, engines, vllm)
    key = _engine_key(topology, role)
    commands = [
        _engine_command(python, name, kind, topology, inst, cache_of[name], place[name], key,
                        (gpu_memory_bytes, gpu_name), model.max_context_tokens)
        for name, kind, inst in engines
        if role in (Role.ALL, Role.SINGLE) or (role.value == kind and index in (None, int(name.rsplit("-", 1)[1])))
    ]
    if role in (Role.ALL, Role.PROXY):
        commands.append(proxy_command(python, topology, key))
    if not commands:
        count = len(_instances_of(topology, role))
        raise InputError(f"--index {index}: the topology has {count} {role.value} instance(s); "
                         f"accepted: 0..{count - 1}")
    return LaunchPlan(topology=topology, role=role, index=index, caches=caches, commands=tuple(commands),
                      vllm=vllm, warnings=warnings, engine_key_file=key)


def _engine_key(topology: Topology, role: Role) -> Path | None:
    if role is Role.SINGLE and keys.is_guarded(topology):
        raise InputError("--role single with an API key file: one plain server has no proxy to hold the key; "
                         "accepted: --role all, prefill, decode or proxy (or no key file)")
    return keys.engine_key_file(topology, starts_every_role=role is Role.ALL)


def _engine_command(python: str, name: str, kind: str, topology: Topology, inst: EngineInstance,
                    cache: InstanceCache, place: EnginePlacement, key: Path | None,
                    gpu: tuple[int | None, str | None], model_context: int | None) -> RoleCommand:
    memory, gpu_name = gpu
    is_cuda = topology.device is Device.CUDA
    fit = (context_fit(cache.layout, memory_bytes=memory, share=place.gpu_memory_utilization)
           if is_cuda and place.gpu_memory_utilization is not None else None)
    seqs = (seqs_fit(cache.layout, engine_args=topology.engine.vllm_args + inst.extra_args, memory_bytes=memory,
                     share=place.gpu_memory_utilization, gpu_name=gpu_name) if is_cuda else None)
    limits = resolve_limits(topology.device, topology.engine, fit, seqs)
    argv = engine_argv(python, kind, place.topology, inst, cache, more=place.extra_flags + guard_flags(key),
                       limits=limits)
    env = engine_env(topology, inst, place.extra_env, role=kind)
    has_nixl = kind in ("prefill", "decode")  # a replica or single server has no KV connector, no side channel
    return RoleCommand(name=name, role=Role(kind), argv=argv, env=env,
                       secret_env=((keys.ENGINE_KEY_ENV, key),) if key is not None else (),
                       host=inst.host, port=inst.port, side_channel_port=inst.side_channel_port if has_nixl else None,
                       cache=cache, gpus=place.gpus, gpu_memory_utilization=place.gpu_memory_utilization,
                       sm_percent=inst.sm_percent if place.gpus is not None else None,
                       share=share_line(topology.device, inst, place.gpus, place.gpu_memory_utilization),
                       async_scheduling=resolve_async(topology.engine.is_async_scheduling, topology.device),
                       limits=limits, warmup=_warmup(topology, limits, model_context))


def _warmup(topology: Topology, limits: EngineLimits, model_context: int | None) -> WarmupBurst | None:
    context = limits.max_model_len.value
    return warmup_burst(topology.device, topology.engine.warmup,
                        max_context_tokens=context if isinstance(context, int) else model_context)


def proxy_command(python: str, topology: Topology, engine_key: Path | None = None) -> RoleCommand:
    proxy = topology.proxy
    if proxy.kind is ProxyKind.VLLM_ROUTER:
        return RoleCommand(name="proxy", role=Role.PROXY, argv=router_argv(python, topology),
                           env=(("PYTHONUNBUFFERED", "1"),), host=proxy.host, port=proxy.port,
                           metrics_port=metrics_port(topology))
    argv = [python, "-m", PROXY_MODULE, "--host", proxy.host, "--port", str(proxy.port),
            "--policy", proxy.policy.value, "--timeout", str(proxy.timeout_s), "--model-name", topology.model_name,
            "--first-token", proxy.first_token.value]
    for inst in topology.prefill:
        argv += ["--prefill", f"http://{inst.host}:{inst.port}"]
    for inst in topology.decode:
        argv += ["--decode", f"http://{inst.host}:{inst.port}"]
    for inst in topology.replicas:
        argv += ["--replica", f"http://{inst.host}:{inst.port}"]
    if proxy.api_key_file is not None:  # paths only: the proxy reads the keys when it starts
        argv += ["--api-key-file", str(proxy.api_key_file)]
    if engine_key is not None:
        argv += ["--engine-key-file", str(engine_key)]
    if is_warmup_on(topology.device, topology.engine.warmup):
        argv += ["--warm-file", WARM_FILE]  # the run folder's (the proxy's working directory): warming.py
    return RoleCommand(name="proxy", role=Role.PROXY, argv=tuple(argv), env=(("PYTHONUNBUFFERED", "1"),),
                       host=proxy.host, port=proxy.port)


def _engines(topology: Topology) -> list[tuple[str, str, EngineInstance]]:
    return ([(f"prefill-{i}", "prefill", inst) for i, inst in enumerate(topology.prefill)]
            + [(f"decode-{i}", "decode", inst) for i, inst in enumerate(topology.decode)]
            + [(f"{REPLICA}-{i}", REPLICA, inst) for i, inst in enumerate(topology.replicas)])


def _instances_of(topology: Topology, role: Role) -> tuple[EngineInstance, ...]:
    return {Role.PREFILL: topology.prefill, Role.DECODE: topology.decode}.get(role, topology.replicas)


def _single_engine(topology: Topology) -> list[tuple[str, str, EngineInstance]]:
    """The first decode instance's place and settings (the decode side is the one that generates), or the first
    replica's, served alone."""
    return [("single-0", "single", (topology.decode or topology.replicas)[0])]


def _cache(name: str, model, topology: Topology, inst: EngineInstance) -> InstanceCache:  # noqa: ANN001
    try:
        return instance_cache(model, topology.device, topology.engine, inst)
    except InputError as exc:
        raise InputError(f"{name}: {exc}") from None
