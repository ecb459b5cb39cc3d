"""Aggregated serving: N plain vLLM servers (replicas) behind the project's proxy, the baseline P/D is compared with.

A replica is an engine as launch writes it for P/D (the same EngineOptions, so the same flags: block size, dtypes,
limits, async scheduling, eager or graphs), less the KV connector: `--kv-transfer-config` is P/D's own. The proxy
sends each request whole to one replica of its pool (core/proxy/app.py), by the topology's policy, with the same
failover as P/D's hops: a replica that refuses or breaks before any byte reached the client is routed around.

Why the project's proxy and not vllm-router or vLLM's data parallelism: P/D's requests pass the same front door
(FastAPI + httpx, one more hop), so the two configurations pay the same proxy cost; its policies (round_robin,
least_outstanding) and health probes are the ones P/D's pools use; and each replica is its own process, so under
MPS each gets its own SM share (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE is read per process when its CUDA context is
made: one `vllm serve --data-parallel-size N` process tree would give every rank the same one).

Ports of `local_replicas`: proxy `base_port`, replica i `base_port + 100 * (i + 1)`. On CPU replica i runs on core
i modulo the cores (equal resources to 1P1D's prefill on core 0 and decode on the last core); on CUDA on GPU i
modulo the GPUs, GPU sharers splitting memory as P/D's roles do (gpus.py).
"""

from __future__ import annotations

from pathlib import Path

from hybridserve.core.common.errors import InputError
from hybridserve.core.launch.topology import (TINY_MODEL_DIR, Device, EngineInstance, EngineOptions, ProxyInstance,
                                              RoutingPolicy, Topology)

KIND = "replica"
MAX_LOCAL_REPLICAS = 64


def local_replicas(*, num_replicas: int, model: Path | None = None, device: Device = Device.CPU,
                   engine: EngineOptions | None = None, num_cores: int = 2, num_gpus: int = 1,
                   base_port: int = 8000, policy: RoutingPolicy = RoutingPolicy.ROUND_ROBIN) -> Topology:
    """`num_replicas` plain servers and the proxy on this machine (`launch --replicas N`); the proxy's policy is P/D's
    default too (compare like with like: a topology file sets `proxy: {policy: least_outstanding}` for both)."""
    if not 1 <= num_replicas <= MAX_LOCAL_REPLICAS:
        raise InputError(f"--replicas {num_replicas}: accepted: 1-{MAX_LOCAL_REPLICAS} replicas")
    units = num_cores if device is Device.CPU else num_gpus
    replicas = tuple(EngineInstance(port=base_port + 100 * (i + 1), side_channel_port=base_port + 100 * (i + 1) + 50,
                                    devices=(i % max(1, units),)) for i in range(num_replicas))
    return Topology(model=(model or TINY_MODEL_DIR).resolve(), device=device, engine=engine or EngineOptions(),
                    replicas=replicas, proxy=ProxyInstance(port=base_port, policy=policy))


def check_shape(topology: Topology, where: str = "topology") -> None:
    """Either prefill and decode instances (P/D) or replicas (aggregated), not both, not neither."""
    has_pd = bool(topology.prefill or topology.decode)
    if topology.replicas and has_pd:
        raise InputError(f"{where}: both replicas and prefill/decode instances; accepted: prefill and decode lists "
                         "(P/D) or a replicas list (aggregated serving)")
    if not topology.replicas and not (topology.prefill and topology.decode):
        raise InputError(f"{where}: accepted: a non-empty prefill and a non-empty decode list (P/D), or a non-empty "
                         "replicas list (aggregated serving)")
