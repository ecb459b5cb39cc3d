"""How the roles placed on one GPU share its memory, and in which waves engines that share a GPU start. Placement is
by GPU id, never by CPU core id."""

from __future__ import annotations

import math
from collections.abc import Iterable

from hybridserve.core.common.errors import InputError
from hybridserve.core.layout.capacity import VLLM_GPU_MEMORY_UTILIZATION

MAX_TOTAL_SHARE = 0.95  # what the roles on one GPU may ask for together; the rest is CUDA context and NCCL headroom
DEFAULT_SHARE = VLLM_GPU_MEMORY_UTILIZATION  # a role with a GPU to itself gets what `vllm serve` alone would


def memory_shares(placements: Iterable[tuple[str, tuple[int, ...]]], *, total: float = DEFAULT_SHARE,
                  fixed: dict[str, float] | None = None) -> dict[str, float]:
    """--gpu-memory-utilization per role: `total` of each GPU split evenly among the roles placed on it.

    `placements` is (role name, GPU ids); a TP role on several GPUs gets the smallest of its GPUs' shares.
    `fixed` holds shares the topology set; the others split what is left. Raises InputError when a GPU's
    shares sum to more than MAX_TOTAL_SHARE. Example: prefill and decode on GPU 0, total 0.92 -> 0.46 each.
    """
    placements = list(placements)
    fixed = fixed or {}
    if not 0 < total <= MAX_TOTAL_SHARE:
        raise InputError(f"--gpu-memory-utilization {total}: accepted: more than 0, at most {MAX_TOTAL_SHARE} "
                         "(the part of each GPU that launch splits among the roles placed on it)")
    on_gpu: dict[int, list[str]] = {}
    for name, gpus in placements:
        for gpu in gpus:
            on_gpu.setdefault(gpu, []).append(name)
    share_of: dict[str, float] = {}
    for gpu, names in sorted(on_gpu.items()):
        taken = sum(fixed[n] for n in names if n in fixed)
        free = [n for n in names if n not in fixed]
        if taken + (0.01 * len(free)) > MAX_TOTAL_SHARE + 1e-9:
            raise InputError(f"GPU {gpu}: gpu_memory_utilization of {', '.join(names)} sum to {taken:.3f}; "
                             f"accepted: at most {MAX_TOTAL_SHARE} for all roles on one GPU")
        each = _round_down(max(0.0, min(total, MAX_TOTAL_SHARE) - taken) / len(free)) if free else 0.0
        for name in names:
            share = fixed.get(name, each)
            share_of[name] = min(share_of.get(name, share), share)
    return {name: share_of[name] for name, _ in placements}


def start_waves(placements: Iterable[tuple[str, tuple[int, ...]]],
                fixed_kv: frozenset[str] = frozenset()) -> list[list[str]]:
    """Start order: a role that shares a GPU with an earlier one waits for it to be healthy.

    vLLM sizes its KV cache from the change in free GPU memory while it profiles; a neighbour allocating or
    freeing on the same GPU at that moment makes the estimate wrong or trips vLLM's assert
    (`gpu_worker.determine_available_memory`: "Error in memory profiling"). Roles on separate GPUs start together.
    `fixed_kv`: the engines given `--kv-cache-memory-bytes`, for which vLLM skips that profiling (the same function,
    0.26 and 0.32: "skipped memory profiling"); where every engine on a GPU is one, they start together (a cold
    60-layer P/D start on one H200 took two waves of ~150 s each).
    """
    placements = list(placements)
    sharers: dict[int, set[str]] = {}
    for name, gpus in placements:
        for gpu in gpus:
            sharers.setdefault(gpu, set()).add(name)
    profiling_gpus = {gpu for gpu, names in sharers.items() if not names <= fixed_kv}
    waves: list[list[str]] = []
    busy: list[set[int]] = []
    for name, gpus in placements:
        waits_for = set(gpus) & profiling_gpus
        for wave, used in zip(waves, busy):
            if not used & waits_for:
                wave.append(name)
                used.update(waits_for)
                break
        else:
            waves.append([name])
            busy.append(waits_for)
    return waves


def check_gpus_exist(placements: Iterable[tuple[str, tuple[int, ...]]], num_gpus: int) -> None:
    """Refuse, in one line, a GPU id this host does not have."""
    for name, gpus in placements:
        for gpu in gpus:
            if not 0 <= gpu < num_gpus:
                have = f"GPUs 0..{num_gpus - 1}" if num_gpus else "no GPU (nvidia-smi/NVML found none)"
                raise InputError(f"{name}: GPU {gpu} does not exist; this host has {have}")


def _round_down(share: float) -> float:
    return math.floor(share * 1000 + 1e-9) / 1000
