"""SM shares of one GPU under NVIDIA MPS: N engines standing for N smaller GPUs (an emulation, and named one).

An instance with `sm_percent` runs with `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` set to it: an MPS client's kernels then
use at most that part of the GPU's SMs (CUDA MPS documentation, "Volta MPS Execution Resource Provisioning"); its
memory share stays `--gpu-memory-utilization` (or `--kv-cache-memory-bytes`). Both configurations of a comparison
share the memory bandwidth the same way. MPS is a daemon (`nvidia-cuda-mps-control -d`, stopped by
`echo quit | nvidia-cuda-mps-control`), not a setting of the card: launch never starts or stops it. Without the
daemon the variable does nothing, so a share on a GPU the daemon does not serve is refused before anything starts;
the benchmark that needs the daemon starts and quits it in the same call (benchmarks/equal_resources.py).
"""

from __future__ import annotations

from hybridserve.core.common.errors import InputError
from hybridserve.core.host.mps_daemon import CONTROL, MpsDaemon, pipe_dir
from hybridserve.core.launch.topology import Device, EngineInstance, Topology

PERCENT_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"


def share_line(device: Device, instance: EngineInstance, gpus: tuple[int, ...] | None,
               memory: float | None) -> str:
    """What of the machine an engine gets, for the dry run: its cores on CPU; its GPUs, SM share and memory share
    on CUDA."""
    if device is not Device.CUDA:
        cores = instance.devices
        return f"cores {', '.join(map(str, cores))}" if cores is not None else "cores: not pinned (every core)"
    sms = (f"{instance.sm_percent} % of the SMs (MPS: {PERCENT_ENV})" if instance.sm_percent is not None
           else "all SMs (no MPS share)")
    where = f"GPU {', '.join(map(str, gpus or ()))}"
    return f"{where}: {sms}, {memory} of its memory (--gpu-memory-utilization)"


def mps_env(instance: EngineInstance) -> tuple[tuple[str, str], ...]:
    return ((PERCENT_ENV, str(instance.sm_percent)),) if instance.sm_percent is not None else ()


def check_shares(topology: Topology) -> None:
    """A share is a CUDA setting in 1-100 percent; on CPU the share is the instance's cores (`devices`)."""
    for kind, instances in (("prefill", topology.prefill), ("decode", topology.decode),
                            ("replica", topology.replicas)):
        for i, inst in enumerate(instances):
            if inst.sm_percent is None:
                continue
            if topology.device is not Device.CUDA:
                raise InputError(f"{kind}-{i}: sm_percent {inst.sm_percent} on device cpu; accepted: sm_percent "
                                 "with device cuda only (on CPU an engine's share is its cores: devices)")
            if isinstance(inst.sm_percent, bool) or not 1 <= inst.sm_percent <= 100:
                raise InputError(f"{kind}-{i}: sm_percent {inst.sm_percent}; accepted: 1-100 (percent of the SMs)")


def check_daemon(shares: list[tuple[str, tuple[int, ...], int]], daemon: MpsDaemon | None) -> None:
    """`shares`: (engine name, its GPUs, its percent) of every engine given a share. Refuse, in one line, a share on
    a GPU that no running MPS daemon serves."""
    for name, gpus, percent in shares:
        for gpu in gpus:
            if daemon is None:
                raise InputError(f"{name}: sm_percent {percent} on GPU {gpu}, but no MPS control daemon runs here "
                                 f"(nothing listening in {pipe_dir()}); accepted: start it first "
                                 f"({CONTROL} -d), or no sm_percent")
            if daemon.gpus is not None and gpu not in daemon.gpus:
                raise InputError(f"{name}: sm_percent {percent} on GPU {gpu}, but the MPS daemon serves GPUs "
                                 f"{', '.join(map(str, daemon.gpus))} only; accepted: a GPU it serves, or no "
                                 "sm_percent")
