"""Validation targets: a URL that is already serving, or a launch configuration that validate starts itself.

Named configurations (each started through `hybridserve.core.launch.plan`, never through the CLI):
- `single-sync` (default baseline): one plain vLLM server, sync scheduling.
- `single-async`: the same server with async scheduling.
- `pd-async` (default candidate): prefill + decode over NixlConnector + the project's proxy, async scheduling.
- `pd-sync`: the same P/D deployment with sync scheduling.
A fault (see core/vllm_plugin/faults.py) may be armed in the decode server of a P/D configuration, for the
server's life, or through a switch file in the run folder (`is_fault_switchable`): `Deployment.arm` then changes the
fault of the running deployment, so a clean run and each fault need one start, not one each.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from hybridserve import profiles as _profiles_pkg
from hybridserve.core.common import atomic_file
from hybridserve.core.common.errors import CouldNotRunError, InputError

RECALL_MODEL_DIR = Path(_profiles_pkg.__file__).parent / "tiny-qwen3.5-recall"
from hybridserve.core.common.fault_kind import (  # read by the plugin in the decode server
    FAULT_ENV, FAULT_FILE_ENV, FaultKind,
)


class Config(enum.Enum):
    SINGLE_SYNC = "single-sync"
    SINGLE_ASYNC = "single-async"
    PD_ASYNC = "pd-async"
    PD_SYNC = "pd-sync"

    @property
    def is_pd(self) -> bool:
        return self in (Config.PD_ASYNC, Config.PD_SYNC)

    @property
    def is_async(self) -> bool:
        return self in (Config.PD_ASYNC, Config.SINGLE_ASYNC)


@dataclass(frozen=True, kw_only=True)
class Target:
    """What to validate: `url` when something already serves it, else a configuration to start."""

    label: str
    url: str | None = None
    config: Config | None = None
    fault: FaultKind | None = None  # armed in the decode server (P/D configurations only)


def parse_target(text: str, *, what: str, fault: FaultKind | None = None) -> Target:
    text = text.strip()
    if text.startswith(("http://", "https://")):
        if fault is not None:
            raise InputError(f"--{what} {text}: a fault can only be armed in a configuration validate starts")
        return Target(label=text, url=text.rstrip("/"))
    for config in Config:
        if config.value == text.lower():
            if fault is not None and not config.is_pd:
                raise InputError(f"--{what} {text}: faults need a P/D configuration (pd-async or pd-sync)")
            label = config.value if fault is None else f"{config.value} + fault {fault.value}"
            return Target(label=label, config=config, fault=fault)
    names = ", ".join(c.value for c in Config)
    raise InputError(f"--{what} {text!r}: accepted: an http(s):// URL or one of {names}")


def default_model() -> Path:
    """The trained recall model when it is there, else launch's tiny model."""
    from hybridserve.core.launch.topology import TINY_MODEL_DIR

    return RECALL_MODEL_DIR if (RECALL_MODEL_DIR / "config.json").is_file() else TINY_MODEL_DIR


# Launch's random-weight model has a byte-level BPE tokenizer (about 5 tokens per synthetic word): 100-160 words are
# 500-800 tokens, more than two 256-token blocks and inside its 2048-token context (520-760 words would not fit).
RANDOM_MODEL_SYNTHETIC = "synthetic:100-160"


def is_random_model(model: Path | None) -> bool:
    """Whether `model` (None: the default) is launch's tiny model with random weights rather than the trained one."""
    from hybridserve.core.launch.topology import TINY_MODEL_DIR

    return (model or default_model()).resolve() == TINY_MODEL_DIR.resolve()


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
    from hybridserve.core.launch.gpus import count_gpus
    from hybridserve.core.launch.topology import Device, EngineOptions, local_topology

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
    from hybridserve.core.launch.machine import machine_plan
    from hybridserve.core.launch.plan import Role

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
    from hybridserve.core.launch.runner import new_run_dir, started

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
    from hybridserve.core.common.contracts import SCHEDULER_LOG_PREFIX

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
