"""Keep the worker's compute thread on the cores `hybridserve launch` gave the server.

On CPU, vLLM's NixlConnector worker (`nixl/base_worker.py`, "reserve different cores for start_load_kv() from
model_forward()") calls `os.sched_setaffinity(0, [last core of each NUMA node])` after
`VLLM_CPU_OMP_THREADS_BIND` has bound the threads. Thread 0 there is the worker's main thread, which runs the
forward pass, so on a 2-core box the prefill worker's compute moves onto core 1, the decode server's core, and
the two servers share one core (measured: P/D 5x slower, leases expiring).

How: that module's `os` is replaced by a view of `os` whose `sched_setaffinity` pins to the assigned cores
instead of the last core. Everything else in `os` is untouched.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any

from hybridserve.core.vllm_plugin.import_hooks import after_import
from hybridserve.core.vllm_plugin.log import logger

NIXL_WORKER_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker"


class _OsWithAssignedCores:
    def __init__(self, cores: tuple[int, ...]) -> None:
        self._cores = cores

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def sched_setaffinity(self, pid: int, cores: Any) -> None:
        logger.info("hybridserve: NixlConnector asked to move thread %s to cores %s; kept on assigned cores %s",
                    pid, sorted(cores), list(self._cores))
        os.sched_setaffinity(pid, self._cores)


def patch_worker_module(module: ModuleType, cores: tuple[int, ...]) -> None:
    if isinstance(getattr(module, "os", None), _OsWithAssignedCores):
        return
    module.os = _OsWithAssignedCores(cores)


def install(cores: tuple[int, ...]) -> None:
    if not cores:
        raise ValueError("no cores to keep the compute thread on")
    after_import(NIXL_WORKER_MODULE, lambda module: patch_worker_module(module, cores))
