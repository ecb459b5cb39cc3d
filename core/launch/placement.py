"""Per engine: the GPUs it runs on, its share of their memory, and what the installed vLLM needs added.

Pure: the GPU count and the vLLM version come in from the caller (request.py reads them from the machine).
On CUDA every engine gets `--gpu-memory-utilization` (its share, gpus.memory_shares) and the UCX variables that
keep same-host VRAM reads on cuda_ipc (core/common/ucx.py); a decode engine, which READs from prefill, also runs
without cuda_ipc's mapping cache, so that a dead prefill's memory is not kept for the life of its decodes, and with
the plugin's peer_pin (core/vllm_plugin/peer_pin.py), so that without the cache its READs still open nothing. On vLLM
0.26 a text-only Qwen3.5 is served from its wrapped form (model_form.py) with `--language-model-only`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hybridserve.core.common import contracts, ucx
from hybridserve.core.host import model_form
from hybridserve.core.host.vllm_version import VllmFeatures, check_gdn_backend
from hybridserve.core.launch.engine_command import EngineFlag
from hybridserve.core.launch.gpu_shares import memory_shares
from hybridserve.core.launch.mps import mps_env
from hybridserve.core.launch.topology import Device, EngineInstance, Topology


@dataclass(frozen=True, kw_only=True)
class EnginePlacement:
    topology: Topology  # what the engine's command line is written from (the model folder vLLM loads)
    gpus: tuple[int, ...] | None = None
    gpu_memory_utilization: float | None = None
    extra_flags: tuple[EngineFlag, ...] = ()  # after launch's own flags; --vllm-arg may not override them either
    extra_env: tuple[tuple[str, str], ...] = ()


def engine_gpus(instance: EngineInstance) -> tuple[int, ...]:
    """The GPU ids an engine uses: the ones it names, else vLLM's default of the first `tp` GPUs."""
    return instance.devices if instance.devices is not None else tuple(range(instance.tp))


def served_topology(topology: Topology, vllm: VllmFeatures) -> Topology:
    """The topology whose model folder this vLLM can load; the served name stays the original folder's."""
    if vllm.has_text_only_qwen3_5 or not model_form.needs_wrapper(topology.model):
        return topology
    return replace(topology, model=model_form.wrapped_dir(topology.model), served_model_name=topology.model_name)


def placements(topology: Topology, engines: list[tuple[str, str, EngineInstance]],
               vllm: VllmFeatures) -> dict[str, EnginePlacement]:
    check_gdn_backend(vllm, topology.engine.gdn_prefill_backend)
    served = served_topology(topology, vllm)
    model_flags = (EngineFlag("--language-model-only", ("--language-model-only",),
                              "always on vLLM 0.26 for a text-only Qwen3.5, served in its wrapped form"),
                   ) if served is not topology else ()
    if topology.device is not Device.CUDA:
        return {name: EnginePlacement(topology=served, extra_flags=model_flags) for name, _, _ in engines}
    where = [(name, engine_gpus(inst)) for name, _, inst in engines]
    fixed = {name: inst.gpu_memory_utilization for name, _, inst in engines if inst.gpu_memory_utilization}
    shares = memory_shares(where, total=topology.engine.gpu_memory_utilization, fixed=fixed)
    kinds = {name: kind for name, kind, _ in engines}
    mps = {name: mps_env(inst) for name, _, inst in engines}  # an SM share under MPS (mps.py)
    return {name: EnginePlacement(topology=served, gpus=gpus, gpu_memory_utilization=shares[name],
                                  extra_flags=model_flags + (_memory_flag(shares[name]),),
                                  extra_env=_cuda_env(is_reader=kinds[name] == "decode") + mps[name])
            for name, gpus in where}


def _cuda_env(*, is_reader: bool) -> tuple[tuple[str, str], ...]:
    """UCX's same-host READ variables; a reader (decode) also pins its live prefills' KV allocations (peer_pin.py),
    which keeps its READs free of cuda_ipc opens with the mapping cache off (a topology `env` may set it to 0)."""
    env = ucx.cuda_ipc_env(is_reader=is_reader)
    if is_reader:
        env[contracts.PIN_PEER_REGIONS] = "1"
    return tuple(sorted(env.items()))


def _memory_flag(share: float) -> EngineFlag:
    return EngineFlag("--gpu-memory-utilization", ("--gpu-memory-utilization", str(share)),
                      "set it with --gpu-memory-utilization, or topology: gpu_memory_utilization")
