"""A launch plan (core/launch/launch_plan.py) as a Ray Serve config: one P/D application, built by the project's builder.

The same LaunchPlan that `launch` runs on hosts writes this config, so every engine gets what launch gives it: the
hybrid rules (VLLM_SSM_CONV_STATE_LAYOUT=DS, no prefix caching, the hybrid KV cache manager, one block size and
state dtypes on P and D: checked by preflight's check_pairs on the same plan), NixlConnector's config, the CPU
binding and the plugin's switches. What changes on Ray:

- One Serve deployment per role: the topology's prefill instances are the replicas of "Prefill", its decode
  instances those of "Decode" (Ray routes among them). A role's instances must therefore share their settings
  (TP, cores, env, extra flags); the host and the ports may differ.
- Placement by Ray custom resources: a replica of a role asks for one unit of `hybridserve_prefill` (or
  `_decode`), and each host of the topology offers as many units as it has instances of that role
  (`host_resources`, the `ray start --resources` of that host). The ingress asks for `hybridserve_ingress`,
  which only the proxy's host offers: the front key file is read there.
- Host-bound settings (the NIXL side-channel host, UCX/gloo devices, VLLM_HOST_IP) are set by each replica when it
  starts (servers.py): the role's address when all its instances share one (127.0.0.1 on one machine: Ray names a
  node by its network address even when told loopback), else its Ray node's address. The side-channel port of the
  first instance is the base Ray adds the replica's rank to (`NIXL_SIDE_CHANNEL_PORT_BASE`).
- The engine key is Ray's cluster token (cluster.py): the engines have no HTTP listener of their own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hybridserve.core.common.contracts import BIND_HOST_ENV
from hybridserve.core.common.errors import InputError
from hybridserve.core.launch.engine_command import STARTUP_DIR
from hybridserve.core.launch.launch_plan import LaunchPlan, Role, RoleCommand
from hybridserve.core.launch.topology import Device, FirstTokenSource, Topology
from hybridserve.core.rayserve.engine_kwargs import engine_kwargs

BUILDER = "hybridserve.core.rayserve.app:build_app"
APP_NAME = "hybridserve"
INGRESS_RESOURCE = "hybridserve_ingress"
# Set per replica from its node (servers.py), or chosen by Ray (the GPU ids), never one value for every replica.
HOST_BOUND_ENV = frozenset({"VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT", "VLLM_HOST_IP",
                            "UCX_NET_DEVICES", "GLOO_SOCKET_IFNAME", "CUDA_VISIBLE_DEVICES", "PYTHONPATH"})
RAY_HEALTH_CHECK_PERIOD_S = 10.0  # Ray Serve's default (DEFAULT_HEALTH_CHECK_PERIOD_S)


def startup_path(startup_dir: str) -> str:
    """Every worker of the app (replicas, Ray's ingress, the builder's task) starts with the project's startup folder
    first on its path, as launch's servers do: its sitecustomize arms the torchvision shim before Ray unpickles a
    replica's arguments, which imports vLLM (and vLLM torchvision). Ray expands ${PYTHONPATH} on the node."""
    return f"{startup_dir}:${{PYTHONPATH}}"


def role_resource(role: str) -> str:
    return f"hybridserve_{role}"


@dataclass(frozen=True, kw_only=True)
class RayOptions:
    health_check_period_s: float = RAY_HEALTH_CHECK_PERIOD_S  # how soon Serve sees a dead engine and restarts it
    is_failover: bool = True  # the decode replica retries another prefill, or computes the prompt itself (servers.py)
    model_source: str | None = None  # where the nodes find the model (an image path, a hub id); None: the plan's


def serve_config(plan: LaunchPlan, options: RayOptions = RayOptions()) -> dict[str, Any]:
    """The Serve config (ServeDeploySchema's fields) of a plan of every role (launch's --role all)."""
    if plan.role is not Role.ALL:
        raise InputError(f"--role {plan.role.value} with --engine ray: Ray places every role itself; accepted: "
                         "--role all (the topology names the hosts)")
    topology = plan.topology
    proxy = topology.proxy
    args = {
        "prefill_config": _llm_config(plan, "prefill", options),
        "decode_config": _llm_config(plan, "decode", options),
        "ingress_deployment_config": {"num_replicas": 1,
                                      "ray_actor_options": {"resources": {INGRESS_RESOURCE: 0.01}}},
        "first_token": proxy.first_token.value if proxy.first_token is FirstTokenSource.PREFILL else "decode",
        "is_failover": options.is_failover,
        "api_key_file": str(proxy.api_key_file) if proxy.api_key_file is not None else None,
    }
    config = {
        "proxy_location": "HeadOnly",  # one door, on the head node: the topology's proxy host
        "http_options": {"host": proxy.host, "port": proxy.port},
        "applications": [{"name": APP_NAME, "route_prefix": "/", "import_path": BUILDER, "args": args,
                          "runtime_env": {"env_vars": {}}}],
    }
    set_startup_dir(config, STARTUP_DIR)
    return config


def set_startup_dir(config: dict[str, Any], startup_dir: str) -> None:
    """PYTHONPATH of every worker the app starts: the builder's task (the application's runtime_env), Ray's ingress
    and each engine's replica and node task (Ray LLM gives them the LLM config's runtime_env instead of the
    application's, and Ray's ingress none: both were seen failing on torchvision without it)."""
    app = config["applications"][0]
    args = app["args"]
    ingress = args["ingress_deployment_config"]["ray_actor_options"]
    for env in (app["runtime_env"]["env_vars"], args["prefill_config"]["runtime_env"]["env_vars"],
                args["decode_config"]["runtime_env"]["env_vars"],
                ingress.setdefault("runtime_env", {"env_vars": {}})["env_vars"]):
        env["PYTHONPATH"] = startup_path(startup_dir)


def host_resources(topology: Topology) -> dict[str, dict[str, float]]:
    """What each host of the topology offers Ray (`ray start --resources`): a unit per instance of a role it holds,
    and the ingress's unit on the proxy's host."""
    hosts: dict[str, dict[str, float]] = {topology.proxy.host: {INGRESS_RESOURCE: 1.0}}
    for role, instances in (("prefill", topology.prefill), ("decode", topology.decode)):
        for inst in instances:
            offer = hosts.setdefault(inst.host, {})
            offer[role_resource(role)] = offer.get(role_resource(role), 0.0) + 1.0
    return hosts


def _llm_config(plan: LaunchPlan, role: str, options: RayOptions) -> dict[str, Any]:
    commands = [c for c in plan.commands if c.role is Role(role)]
    configs = [_one_llm_config(plan.topology, c, options) for c in commands]
    for command, config in zip(commands[1:], configs[1:]):
        if config != configs[0]:
            what = next(k for k in config if config[k] != configs[0][k])
            raise InputError(f"{command.name}: its {what} differs from {commands[0].name}'s; accepted with --engine "
                             f"ray: the same settings on every {role} instance (they are replicas of one Ray "
                             "deployment; only host and ports may differ)")
    config = configs[0]
    config["deployment_config"]["num_replicas"] = len(commands)
    return config


def _one_llm_config(topology: Topology, command: RoleCommand, options: RayOptions) -> dict[str, Any]:
    flags = command.argv[3:]  # after `python -m vllm.entrypoints.openai.api_server`
    model = flags[flags.index("--model") + 1]
    kwargs = engine_kwargs(flags)
    inst = (topology.prefill if command.role is Role.PREFILL else topology.decode)[0]
    env = {k: v for k, v in command.env if k not in HOST_BOUND_ENV}
    hosts = {i.host for i in (topology.prefill if command.role is Role.PREFILL else topology.decode)}
    if len(hosts) == 1:  # the role's one address: its replicas listen there, as launch's servers do (servers.py)
        env[BIND_HOST_ENV] = hosts.pop()
    config: dict[str, Any] = {
        "model_loading_config": {"model_id": topology.model_name, "model_source": options.model_source or model},
        "engine_kwargs": kwargs,
        "accelerator_config": {"kind": "cpu" if topology.device is Device.CPU else "gpu"},
        "placement_group_config": {"bundles": _bundles(command, kwargs.get("tensor_parallel_size", 1)),
                                   "strategy": "STRICT_PACK"},  # a TP engine on one host, as launch runs it
        "runtime_env": {"env_vars": env},
        "deployment_config": {"health_check_period_s": options.health_check_period_s},
        "experimental_configs": {"NIXL_SIDE_CHANNEL_PORT_BASE": inst.side_channel_port},
    }
    return config


def _bundles(command: RoleCommand, tp: int) -> list[dict[str, float]]:
    """One bundle per TP rank; the first holds the role's unit, which pins the replica to the topology's hosts.
    CUDA: a whole GPU a rank, or the engine's memory share of it when roles share GPUs (P and D on one GPU)."""
    unit = {"CPU": 1.0} if command.gpus is None else {"GPU": _gpu_share(command)}
    return [{**unit, role_resource(command.role.value): 1.0}] + [dict(unit) for _ in range(tp - 1)]


def _gpu_share(command: RoleCommand) -> float:
    share = command.gpu_memory_utilization or 1.0
    return 1.0 if share >= 0.9 else share


def ray_start_lines(topology: Topology, *, head: str, num_cpus: int, port: int = 6379) -> list[str]:
    """The `ray start` command of each host (the head first): the resources that pin the roles there."""
    lines = []
    for host, offer in sorted(host_resources(topology).items(), key=lambda kv: kv[0] != head):
        where = "--head --port " + str(port) if host == head else f"--address {head}:{port}"
        lines.append(f"ray start {where} --node-ip-address {host} --num-cpus {num_cpus} "
                     f"--resources '{json.dumps(offer, separators=(',', ':'))}'")
    return lines


def key_file_note(path: Path | None) -> str:
    return "open: Ray's ingress answers anyone who reaches it" if path is None else \
        f"Ray's ingress asks for the key in {path} (Authorization: Bearer) on every path but /health and /metrics"
