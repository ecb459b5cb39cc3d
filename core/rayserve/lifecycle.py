"""`launch --engine ray`: deploy a plan's Serve config on a Ray cluster (given, or a head started here), serve until
a signal, then take everything down that this launch started.

A head started here offers every host's resources of the topology (serve_config.host_resources), so it takes only
a topology whose hosts are all this machine; a topology across hosts runs on a cluster whose nodes were started with
the `ray start` lines that `launch --engine ray --dry-run` prints (one a host), given as --ray-address.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hybridserve.core.common.errors import InputError
from hybridserve.core.host import model_form
from hybridserve.core.launch.bind_env import network_device
from hybridserve.core.launch.keys import read_key, write_new_key
from hybridserve.core.launch.launch_plan import LaunchPlan
from hybridserve.core.launch.placement import served_topology
from hybridserve.core.launch.preflight import check_plugin, check_weights
from hybridserve.core.rayserve import deploy
from hybridserve.core.rayserve.ray_node import LocalNode, RAY_PORT
from hybridserve.core.rayserve.serve_config import host_resources

DEFAULT_NUM_CPUS = 8  # logical CPUs a node offers Ray: with 2 the ingress was never scheduled (issue 41)


@dataclass(frozen=True, kw_only=True)
class RayRun:
    plan: LaunchPlan
    config: dict[str, Any]
    run_dir: Path
    ray_address: str | None = None  # None: start a head on this machine, stop it afterwards
    num_cpus: int = DEFAULT_NUM_CPUS
    timeout_s: float = 600.0

    @property
    def url(self) -> str:
        http = self.config["http_options"]
        return f"http://{http['host']}:{http['port']}"


def check_local(plan: LaunchPlan) -> None:
    """A head started here serves a topology whose every host is this machine."""
    elsewhere = sorted(h for h in host_resources(plan.topology) if network_device(h) is None)
    if elsewhere:
        raise InputError(f"--engine ray without --ray-address: the topology names hosts that are not this machine "
                         f"({', '.join(elsewhere)}); accepted: --ray-address of a cluster whose nodes were started "
                         "with the ray start lines of --dry-run")


def preflight(plan: LaunchPlan) -> None:
    """What launch's preflight checks that still holds when Ray places the engines: weights or --load-format dummy,
    the plugin's patches against the installed vLLM, the front key where the ingress reads it (this machine's when
    the proxy's host is), and the model form vLLM 0.26 loads (written beside the model, which the nodes share).
    Ports and GPUs are the Ray nodes'."""
    check_weights(plan)
    check_plugin(plan)
    served = served_topology(plan.topology, plan.vllm)
    if served.model != plan.topology.model:  # vLLM 0.26 serves a text-only Qwen3.5 from its wrapped form
        model_form.ensure_wrapped(plan.topology.model, served.model)
    front = plan.topology.proxy.api_key_file
    if front is not None and network_device(plan.topology.proxy.host) is not None:
        read_key(front, what="--api-key-file")


def serve_on_ray(run: RayRun, *, on_status: Callable[[deploy.Status], None],
                 on_serving: Callable[[str], None], on_stopping: Callable[[str], None]) -> int:
    """Deploy, serve until SIGINT (130) or SIGTERM (143), take down. Returns the exit code."""
    preflight(run.plan)
    run.run_dir.mkdir(parents=True, exist_ok=True)
    (run.run_dir / "serve.yaml").write_text(yaml.safe_dump(run.config, sort_keys=False))
    node = None
    if run.ray_address is None:
        check_local(run.plan)
        node = _own_head(run)
    seen: dict[str, str] = {}

    def changed(now: deploy.Status) -> None:
        if now.deployments != seen:
            seen.clear()
            seen.update(now.deployments)
            on_status(now)

    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        if node is not None:
            node.start().wait_up()
        deploy.connect(node.gcs_address if node else run.ray_address, token_file(run))
        # again: ray.init installs a SIGTERM handler of its own, which aborts the driver (exit -6, nothing stopped)
        signal.signal(signal.SIGTERM, _raise_terminated)
        deploy.submit(run.config)
        deploy.wait_running(run.timeout_s, changed)
        on_serving(run.url)
        while True:
            time.sleep(2)
            changed(deploy.status())
    except KeyboardInterrupt:
        on_stopping("SIGINT")
        return 130
    except _Terminated:
        on_stopping("SIGTERM")
        return 143
    finally:
        signal.signal(signal.SIGTERM, previous)
        with contextlib.suppress(Exception):
            deploy.take_down(is_own_cluster=node is not None)
        if node is not None:
            node.stop()


def _own_head(run: RayRun) -> LocalNode:
    offer: dict[str, float] = {}
    for resources in host_resources(run.plan.topology).values():
        for name, count in resources.items():
            offer[name] = offer.get(name, 0.0) + count
    return LocalNode(address=run.plan.topology.proxy.host, resources=offer, num_cpus=run.num_cpus,
                     log_path=run.run_dir / "ray-head.log", port=RAY_PORT, token_file=token_file(run))


def token_file(run: RayRun) -> Path | None:
    """The engine key as the cluster's token: the topology's file, or (a head started here) one generated into the
    run folder. A cluster launch did not start keeps the token its operator gave it (RAY_AUTH_* in the
    environment)."""
    key = run.plan.engine_key_file
    if key is None or key.is_absolute():
        return key
    if run.ray_address is not None:
        return None
    path = run.run_dir / key
    if not path.exists():
        write_new_key(path)
    return path


class _Terminated(Exception):
    pass


def _raise_terminated(_signum: int, _frame: object) -> None:
    raise _Terminated()
