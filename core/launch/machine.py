"""A launch plan checked against this machine: the installed vLLM's command line, the GPUs that exist, and the
model folder in the form that vLLM loads. `launch` and `validate` both start servers through `machine_plan`."""

from __future__ import annotations

from pathlib import Path

from hybridserve.core.host import model_form
from hybridserve.core.host.gpu_memory import gpu_memory_bytes, gpu_name
from hybridserve.core.host.gpus import count_gpus
from hybridserve.core.host.mps_daemon import find_daemon
from hybridserve.core.host.vllm_version import VllmVersion, features_for, installed_vllm
from hybridserve.core.launch.gpu_shares import check_gpus_exist
from hybridserve.core.launch.launch_plan import LaunchPlan, Role, make_launch_plan
from hybridserve.core.launch.mps import check_daemon
from hybridserve.core.launch.placement import served_topology
from hybridserve.core.launch.preflight import check_conv_layout, check_pairs, preflight
from hybridserve.core.launch.topology import Device, Topology


def vllm_version(given: str | None) -> VllmVersion | None:
    """`given` (e.g. "0.26" from --vllm-version) wins; else the installed one's package metadata."""
    return VllmVersion(text=given, distribution="given") if given else installed_vllm()


def machine_plan(topology: Topology, role: Role, *, index: int | None = None, vllm: str | None = None,
                 is_dry_run: bool = False, num_gpus: int | None = None, run_root: Path | None = None,
                 gpu_memory: int | None = None, gpu: str | None = None) -> LaunchPlan:
    """Build the plan for the vLLM named or installed. A dry run trusts the topology (no port looked at, no GPU id
    checked); a real start also preflights ports and extras, refuses GPU ids this host lacks and writes the model
    form. `gpu_memory`: one GPU's bytes for the context and state-block checks, `gpu` its name (None: asked of the
    driver on CUDA, if any)."""
    features, warning = features_for(vllm_version(vllm))
    if gpu_memory is None and topology.device is Device.CUDA:
        gpu_memory, gpu = gpu_memory_bytes(0), gpu_name(0)
    plan = make_launch_plan(topology, role, index=index, vllm=features, warnings=(warning,) if warning else (),
                            gpu_memory_bytes=gpu_memory, gpu_name=gpu)
    if is_dry_run:
        check_pairs(plan)
        check_conv_layout(plan)
        return plan
    preflight(plan, run_root=run_root)
    if topology.device is Device.CUDA:
        check_gpus_exist([(c.name, c.gpus) for c in plan.commands if c.gpus is not None],
                         count_gpus() if num_gpus is None else num_gpus)
        shares = [(c.name, c.gpus, c.sm_percent) for c in plan.commands if c.sm_percent is not None]
        if shares:  # an SM share means nothing without the MPS daemon (mps.py)
            check_daemon(shares, find_daemon())
    served = served_topology(topology, features)
    if served.model != topology.model:
        model_form.ensure_wrapped(topology.model, served.model)
    return plan
