"""`launch --engine ray`: the plan's Serve config (dry run: printed), or deployed on Ray until a signal."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from hybridserve.cli.console import err_console, out_console, print_json
from hybridserve.core.common.errors import InputError, MissingExtraError
from hybridserve.core.launch.launch_plan import LaunchPlan
from hybridserve.core.rayserve.serve_config import RayOptions, key_file_note, ray_start_lines, serve_config

RAY_EXTRA = "ray"


def _say(line: str) -> None:
    err_console.print(line, highlight=False, markup=False, soft_wrap=True)


def command(plan: LaunchPlan, *, failover: bool, health_check_s: float, num_cpus: int, ray_address: str | None,
            run_root: Path, timeout_s: float, is_dry_run: bool, as_json: bool) -> None:
    if health_check_s < 1 or num_cpus < 3:
        raise InputError(f"--ray-health-check-s {health_check_s} / --ray-num-cpus {num_cpus}: accepted: at least "
                         "1 s / at least 3 logical CPUs (prefill, decode and the ingress each take one)")
    options = RayOptions(is_failover=failover, health_check_period_s=health_check_s)
    if is_dry_run:
        dry_run(plan, options, as_json=as_json, num_cpus=num_cpus)
    else:
        run(plan, options, ray_address=ray_address, run_root=run_root, timeout_s=timeout_s, num_cpus=num_cpus,
            as_json=as_json)


def dry_run(plan: LaunchPlan, options: RayOptions, *, as_json: bool, num_cpus: int) -> None:
    """The Serve config on stdout; on stderr the `ray start` line of each host and who may call the ingress."""
    config = serve_config(plan, options)
    topology = plan.topology
    _say("# ray start, one line per host (the head: the proxy's host), then: serve deploy serve.yaml")
    for line in ray_start_lines(topology, head=topology.proxy.host, num_cpus=num_cpus):
        _say(f"#   {line}")
    _say(f"# access: {key_file_note(topology.proxy.api_key_file)}")
    if as_json:
        print_json(config)
    else:
        out_console.print(yaml.safe_dump(config, sort_keys=False), highlight=False, markup=False, soft_wrap=True)


def run(plan: LaunchPlan, options: RayOptions, *, ray_address: str | None, run_root: Path, timeout_s: float,
        num_cpus: int, as_json: bool) -> None:
    import importlib.util
    import os

    from hybridserve.core.supervise.runner import new_run_dir
    from hybridserve.core.rayserve.ray_node import auth_env
    from hybridserve.core.rayserve.lifecycle import RayRun, serve_on_ray, token_file

    run_dir = new_run_dir(run_root.resolve(), "ray")
    _say(f"run folder: {run_dir}")
    job = RayRun(plan=plan, config=serve_config(plan, options), run_dir=run_dir, ray_address=ray_address,
                 timeout_s=timeout_s, num_cpus=num_cpus)
    os.environ.update(auth_env(token_file(job)))  # before anything imports ray: it reads the auth mode once
    for module in ("ray", "ray.llm"):  # found, not imported: ray.llm imports vLLM, which the engines need only
        if importlib.util.find_spec(module) is None:
            raise MissingExtraError(module, RAY_EXTRA, "launch --engine ray")

    def on_status(status) -> None:  # noqa: ANN001
        _say(f"ray serve: {status.app} " + ", ".join(f"{k} {v}" for k, v in sorted(status.deployments.items())))

    def on_serving(url: str) -> None:
        print_json({"run_dir": str(run_dir), "endpoints": {"ray": url}}) if as_json else \
            out_console.print(f"serving on Ray: {url}", highlight=False)
        _say("serving; Ctrl-C takes the deployment down")

    code = serve_on_ray(job, on_status=on_status, on_serving=on_serving,
                        on_stopping=lambda why: _say(f"stopping: {why}"))
    sys.exit(code)
