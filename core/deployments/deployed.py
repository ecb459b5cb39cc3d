"""Start a named configuration (core/deployments/target.py) through launch's plan, yield where to send prompts,
stop it on the way out; and read from its engines' logs which scheduler each ran.

A fault may be armed in the decode server of a P/D configuration for the server's life, or through a switch file in
the run folder (`is_fault_switchable`): `Deployment.arm` then changes the fault of the running deployment, so a
clean run and each fault need one start, not one each.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from hybridserve.core.common import atomic_file
from hybridserve.core.common.contracts import FAULT_ENV, FAULT_FILE_ENV, SCHEDULER_LOG_PREFIX
from hybridserve.core.common.errors import CouldNotRunError, InputError
from hybridserve.core.common.fault_kind import FaultKind
from hybridserve.core.deployments.target import Config, Target
from hybridserve.core.host.gpus import count_gpus
from hybridserve.core.launch.launch_plan import Role
from hybridserve.core.launch.machine import machine_plan
from hybridserve.core.launch.topology import Device, EngineOptions, local_topology
from hybridserve.core.supervise.runner import new_run_dir, started


@dataclass(frozen=True, kw_only=True)
class Deployment:
    url: str  # where prompts go (the proxy for P/D)
    run_dir: Path | None  # logs of the started servers
    engine_logs: tuple[Path, ...]
    fault_file: Path | None = None  # the decode server's fault switch (started with is_fault_switchable)

    def arm(self, fault: FaultKind | None) -> None:
        """Arm `fault` (None: disarm) in the running decode server; it acts from the worker's next step on."""
        if self.fault_file is None:
            raise InputError(f"{self.url}: no fault switch (start the deployment with is_fault_switchable)")
        _write_switch(self.fault_file, fault)


def _write_switch(path: Path, fault: FaultKind | None) -> None:
    atomic_file.write_text(path, fault.value if fault else "")  # the plugin never reads half a name


def config_topology(config: Config, model: Path, base_port: int, num_cores: int, fault: FaultKind | None,
                    device: str = "cpu", engine=None, fault_file: Path | None = None):  # noqa: ANN001
    """The topology `deployed` starts a configuration from (a test builds a variant of the same server from it)."""
    engine = replace(engine or EngineOptions(), is_async_scheduling=config.is_async)
    where = Device.parse(device)
    num_gpus = max(1, count_gpus()) if where is Device.CUDA else 1
    topology = local_topology(model=model, device=where, engine=engine, num_cores=num_cores, num_gpus=num_gpus,
                              base_port=base_port)
    if fault_file is not None:  # the switch file says which fault acts (it starts with `fault`)
        fault_env = (FAULT_FILE_ENV, str(fault_file))
    elif fault is not None:
        fault_env = (FAULT_ENV, fault.value)
    else:
        return topology
    decode = tuple(replace(d, env=(*d.env, fault_env)) for d in topology.decode)
    return replace(topology, decode=decode)


def config_plan(config: Config, topology, *, is_dry_run: bool = False):  # noqa: ANN001, ANN202
    """P/D: launch's `all` plan. Single: launch's decode command without its KV connector, on all cores.
    `is_dry_run`: the same command lines, with nothing on the machine checked or written (launch's dry run)."""
    return machine_plan(topology, Role.ALL if config.is_pd else Role.SINGLE, is_dry_run=is_dry_run)


@contextlib.contextmanager
def deployed(target: Target, *, model: Path, base_port: int, run_root: Path, num_cores: int,
             timeout_s: float, on_progress=None, device: str = "cpu",  # noqa: ANN001
             engine=None, is_fault_switchable: bool = False) -> Iterator[Deployment]:  # noqa: ANN001
    """Yield where to send prompts; a started configuration is stopped (every process group) on the way out.
    `is_fault_switchable` (P/D only): the decode server reads its fault from `run_dir/fault` (Deployment.arm)."""
    if target.url is not None:
        yield Deployment(url=target.url, run_dir=None, engine_logs=())
        return
    assert target.config is not None
    if is_fault_switchable and not target.config.is_pd:
        raise InputError(f"{target.label}: a fault switch needs a P/D configuration (pd-async or pd-sync)")
    run_dir = new_run_dir(run_root, target.config.value)
    fault_file = run_dir / "fault" if is_fault_switchable else None
    if fault_file is not None:
        _write_switch(fault_file, target.fault)
    topology = config_topology(target.config, model, base_port, num_cores, target.fault, device, engine, fault_file)
    plan = config_plan(target.config, topology)
    with started(plan, run_dir, timeout_s=timeout_s, on_progress=on_progress):
        front = plan.commands[-1]  # the proxy for P/D, the server itself for single
        logs = tuple(run_dir / f"{c.name}.log" for c in plan.commands if c.role.is_engine)
        yield Deployment(url=front.url, run_dir=run_dir, engine_logs=logs, fault_file=fault_file)


def schedulers_in_logs(logs: tuple[Path, ...]) -> dict[str, str]:
    """{log name: 'AsyncScheduler' | 'Scheduler' | ...} from the plugin's one line per engine core."""
    found: dict[str, str] = {}
    for log in logs:
        for line in log.read_text(errors="replace").splitlines():
            if SCHEDULER_LOG_PREFIX in line:
                found[log.stem] = line.split(SCHEDULER_LOG_PREFIX, 1)[1].split()[0]
    return found


def check_scheduling(config: Config, logs: tuple[Path, ...]) -> dict[str, str]:
    """Prove from the server logs that the engines ran the scheduler the configuration asked for."""
    found = schedulers_in_logs(logs)
    want = "AsyncScheduler" if config.is_async else "Scheduler"
    for log in logs:
        if found.get(log.stem) != want:
            raise CouldNotRunError(f"{config.value}: {log.name} shows scheduler {found.get(log.stem)!r}, "
                                   f"expected {want!r} (log {log})")
    return found
