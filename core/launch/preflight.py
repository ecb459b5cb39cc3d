"""Refuse, before anything starts, what vLLM would accept and then silently corrupt or crash on.

vLLM's NIXL compatibility hash covers the vLLM version, model and attention backend, but not the SSM or conv
state dtypes, the conv state layout, TP or block sizes: a prefill/decode pair that differs there starts fine
and then moves state that the other side reads wrongly. Each refusal is one line naming both values.
"""

from __future__ import annotations

import importlib.util
import os
import socket
from collections.abc import Callable, Mapping
from pathlib import Path

from hybridserve.core.common.errors import InputError, MissingExtraError
from hybridserve.core.host import model_form
from hybridserve.core.host.stale_run import port_in_use_error
from hybridserve.core.host.vllm_version import VllmVersion, installed_vllm
from hybridserve.core.launch import keys
from hybridserve.core.launch.engine_command import CONV_LAYOUT_ENV, REQUIRED_CONV_LAYOUT
from hybridserve.core.launch.launch_plan import LaunchPlan, Role, RoleCommand
from hybridserve.core.launch.passthrough import passed_value
from hybridserve.core.launch.router_command import MissingRouterError, ROUTER_IMPORT
from hybridserve.core.launch.topology import Device, ProxyKind
from hybridserve.core.vllm_plugin.compat import IndexFor, check, installed_index

# (module, purpose) each role needs; the extra to install depends on the device.
_ENGINE_MODULES = (("vllm", "the prefill/decode servers"), ("nixl", "the KV + GDN state transfer"))
_PROXY_MODULES = (("fastapi", "the proxy"), ("uvicorn", "the proxy"), ("httpx", "the proxy"))


def preflight(plan: LaunchPlan, *, is_module_available: Callable[[str], bool] | None = None,
              is_port_free: Callable[[str, int], bool] | None = None, run_root: Path | None = None) -> None:
    """Raise InputError / MissingExtraError for the first problem found; return None when all is well.
    `run_root`: where earlier runs' folders are, so a port held by one of them is named with how to stop it."""
    check_pairs(plan)
    check_conv_layout(plan)
    check_weights(plan)
    check_extras(plan, is_module_available or _is_module_available)
    check_plugin(plan)
    check_ports(plan, is_port_free or is_tcp_port_free, run_root=run_root)
    has_proxy = any(c.role is Role.PROXY for c in plan.commands)  # only the proxy's host reads the front key
    keys.check_key_files(plan.topology.proxy.api_key_file if has_proxy else None, plan.engine_key_file)


def check_pairs(plan: LaunchPlan) -> None:
    """Every prefill and every decode instance must agree on state dtypes and block sizes."""
    caches = plan.caches
    first_name, first = caches[0]
    for name, cache in caches[1:]:
        for what, a, b in (
            ("--mamba-ssm-cache-dtype (SSM state dtype)", first.ssm_dtype.value, cache.ssm_dtype.value),
            ("--mamba-cache-dtype (conv state dtype)", first.conv_dtype.value, cache.conv_dtype.value),
            ("block size (tokens)", first.block_size, cache.block_size),
            ("kernel block size (tokens)", first.kernel_block_size, cache.kernel_block_size),
        ):
            if a != b:
                raise InputError(f"{what} differs: {first_name} has {a}, {name} has {b}; "
                                 f"accepted: the same value on every prefill and decode instance")


def check_conv_layout(plan: LaunchPlan) -> None:
    topology = plan.topology
    for kind, instances in (("prefill", topology.prefill), ("decode", topology.decode)):
        for i, inst in enumerate(instances):
            layout = dict(inst.env).get(CONV_LAYOUT_ENV, REQUIRED_CONV_LAYOUT)
            if layout != REQUIRED_CONV_LAYOUT:
                raise InputError(f"{kind}-{i}: {CONV_LAYOUT_ENV}={layout}; accepted: {REQUIRED_CONV_LAYOUT} "
                                 f"(NIXL moves GDN conv state only in the dim-first layout, on both sides)")


def check_weights(plan: LaunchPlan) -> None:
    """A folder without weight files (config and tokenizer only) is served with random weights, when asked."""
    topology = plan.topology
    if not any(c.role.is_engine for c in plan.commands) or model_form.has_weights(topology.model):
        return
    for inst in topology.prefill + topology.decode + topology.replicas:
        if passed_value(topology.engine.vllm_args + inst.extra_args, "--load-format") != "dummy":
            raise InputError(f"--model {topology.model}: no weight files ({', '.join(model_form.WEIGHT_PATTERNS)}); "
                             "accepted: a folder with weights, or random ones: --vllm-arg=--load-format "
                             "--vllm-arg=dummy")


def check_extras(plan: LaunchPlan, is_available: Callable[[str], bool]) -> None:
    extra = "cpu" if plan.topology.device is Device.CPU else "cuda"
    roles = {c.role for c in plan.commands}
    is_ours = plan.topology.proxy.kind is ProxyKind.HYBRIDSERVE
    needed = (_ENGINE_MODULES if roles & {Role.PREFILL, Role.DECODE, Role.REPLICA} else ()) + (
        _PROXY_MODULES if Role.PROXY in roles and is_ours else ())
    for module, purpose in needed:
        if not is_available(module):
            raise MissingExtraError(module, extra, f"launch --role {plan.role.value}: {purpose}")
    if Role.PROXY in roles and plan.topology.proxy.kind is ProxyKind.VLLM_ROUTER and not is_available(ROUTER_IMPORT):
        raise MissingRouterError(f"launch --role {plan.role.value} --router vllm-router")


def check_plugin(plan: LaunchPlan, environ: Mapping[str, str] | None = None, version: VllmVersion | None = None,
                 index_for: IndexFor | None = None) -> None:
    """Every plugin patch an engine will install can run on the installed vLLM (its line, the names it touches,
    read from vLLM's source: core/vllm_plugin/compat.py). The plugin checks again in the server; here the refusal
    comes before anything starts."""
    from hybridserve.core.vllm_plugin import armed_specs  # lazy: the plugin package loads its 15 patch modules

    version = version or installed_vllm()
    if version is None:
        return
    environ = os.environ if environ is None else environ
    for command in plan.commands:
        if not command.role.is_engine:
            continue
        found = check(armed_specs({**environ, **dict(command.env)}), version, index_for or installed_index)
        if found:
            raise InputError(f"{command.name}: {found[0].message}; accepted: vLLM {found[0].supported}, or that "
                             "patch's switch off")


def check_ports(plan: LaunchPlan, is_free: Callable[[str, int], bool], *, run_root: Path | None = None) -> None:
    seen: dict[tuple[str, int], str] = {}
    for command in plan.commands:
        for port in _ports(command):
            key = (command.host, port)
            if key in seen:
                raise InputError(f"{command.name}: port {port} on {command.host} is also given to {seen[key]}; "
                                 f"accepted: a distinct port per role on one host")
            seen[key] = command.name
            if not is_free(command.host, port):
                raise port_in_use_error(command.name, command.host, port, run_root)


def is_tcp_port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _ports(command: RoleCommand) -> tuple[int, ...]:
    return tuple(p for p in (command.port, command.side_channel_port, command.metrics_port) if p is not None)


def _is_module_available(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
