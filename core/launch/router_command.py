"""The command line of vllm-router (PyPI `vllm-router`, vLLM's Rust router) in NIXL P/D mode, launch's `proxy` role
when the topology says `proxy: {kind: vllm-router}` or launch gets `--router vllm-router` (pure functions).

It speaks NixlConnector's P/D protocol as the project's proxy does: prefill with max_tokens=1 and
`kv_transfer_params.do_remote_decode`, then decode with the parameters that came back. The flags, from
`vllm-router --help` of 0.1.17 (vllm_router/router_args.py):
- `--vllm-pd-disaggregation --kv-connector nixl --prefill URL ... --decode URL ...`;
- health checks: a worker is taken out after `--health-failure-threshold` (3) failed checks, one every
  `--health-check-interval-secs` (default 60: a dead worker keeps receiving requests for up to 3 minutes; here 2);
- `--worker-startup-check-interval` (default 30 s): launch starts the router once every engine is healthy, so 1 s;
- Prometheus metrics on `--prometheus-host/--prometheus-port` (default 127.0.0.1:29000 even when not asked for, so
  two routers on one host would collide: launch always names the topology's `metrics_port`);
- `--request-timeout-secs` (default 1800): the topology's per-hop `timeout_s`, rounded up.
The router answers `GET /health` itself, which is what launch's start-up wait asks every role.
"""

from __future__ import annotations

import math

from hybridserve.core.common.errors import HybridserveError, InputError
from hybridserve.core.launch.topology import RoutingPolicy, Topology

ROUTER_MODULE = "vllm_router.launch_router"  # what the `vllm-router` console script runs (its main())
ROUTER_IMPORT = "vllm_router"
ROUTER_REQUIREMENT = "vllm-router==0.1.17"  # the version these flags were read from; pyproject's `router` extra
HEALTH_CHECK_INTERVAL_S = 2
HEALTH_CHECK_TIMEOUT_S = 2
WORKER_STARTUP_CHECK_INTERVAL_S = 1
_POLICIES = {RoutingPolicy.ROUND_ROBIN: "round_robin"}  # least_outstanding has no vllm-router counterpart


class MissingRouterError(HybridserveError):
    """vllm-router is not installed (exit 2); the message names the command that installs it."""

    def __init__(self, purpose: str) -> None:
        super().__init__(f"{purpose} needs '{ROUTER_IMPORT}': install it with  pip install '{ROUTER_REQUIREMENT}'  "
                         f"(the extra hybridserve[router])")


def router_argv(python: str, topology: Topology) -> tuple[str, ...]:
    proxy = topology.proxy
    if topology.replicas:
        raise InputError("proxy kind vllm-router with replicas: launch runs vllm-router in its NIXL P/D mode only; "
                         "accepted with replicas: the project's proxy (--router hybridserve)")
    policy = _POLICIES.get(proxy.policy)
    if policy is None:
        raise InputError(f"proxy policy {proxy.policy.value}: vllm-router has no such policy; accepted with "
                         f"kind vllm-router: {', '.join(sorted(_POLICIES.values()))}")
    argv = [python, "-m", ROUTER_MODULE, "--host", proxy.host, "--port", str(proxy.port),
            "--vllm-pd-disaggregation", "--kv-connector", "nixl", "--policy", policy]
    for inst in topology.prefill:
        argv += ["--prefill", f"http://{inst.host}:{inst.port}"]
    for inst in topology.decode:
        argv += ["--decode", f"http://{inst.host}:{inst.port}"]
    argv += ["--health-check-interval-secs", str(HEALTH_CHECK_INTERVAL_S),
             "--health-check-timeout-secs", str(HEALTH_CHECK_TIMEOUT_S),
             "--worker-startup-check-interval", str(WORKER_STARTUP_CHECK_INTERVAL_S),
             "--request-timeout-secs", str(math.ceil(proxy.timeout_s)),
             "--prometheus-host", proxy.host, "--prometheus-port", str(metrics_port(topology))]
    return tuple(argv)


def metrics_port(topology: Topology) -> int:
    """The router's Prometheus port: the topology's `proxy.metrics_port`, else the proxy port + 50."""
    proxy = topology.proxy
    return proxy.metrics_port if proxy.metrics_port is not None else proxy.port + 50
