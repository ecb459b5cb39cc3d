"""Whether vLLM's default `--max-num-seqs` fits a hybrid engine's state blocks on CUDA, and the cap launch writes
where it does not.

What vLLM does (0.26 and 0.32, `CompilationConfig` in config/compilation.py): with full CUDA graphs (its default on
CUDA) and Mamba-type layers, it refuses to start once the KV cache is sized, after profiling, when max_num_seqs
exceeds the pool's block count ("max_num_seqs (1024) exceeds available Mamba cache blocks (93)"): each decode sequence
needs one state block. Its default max_num_seqs for the API server (`EngineArgs.get_batch_defaults`) is 1024 on a GPU
of 70 GiB or more that is no A100 (and on 160 GiB or more), else 256. So on an H200 a hybrid engine on a small memory
share fails after minutes of start-up with vLLM's own default, which no one warned of.

The pool's block count is plan's (core/layout/capacity.py, `kv_bytes // page // T`). Where the engine is given
`--kv-cache-memory-bytes` it is exact: on the H200 (2026-12-05, the 60-layer bench model, vLLM 0.26) 6g gave 93
blocks and 12g 186, as plan counts. From a memory share it is plan's estimate, weights only (vLLM's profile also
takes activations, graphs and what torch does not allocate), so launch keeps STATE_HEADROOM of it: a cap too high
fails the start after minutes (start_failure.py then names vLLM's own count), one too low only lowers concurrency.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hybridserve.core.common.errors import InputError
from hybridserve.core.layout.capacity import MemoryBudget, blocks_held, plan_capacity
from hybridserve.core.layout.rank_layout import RankLayout
from hybridserve.core.model.profiles import load_model

GIB = 2**30
STATE_HEADROOM = 0.9  # of plan's weights-only block estimate from a share (the profile's take is not known here)
KV_CACHE_FLAG = "--kv-cache-memory-bytes"
_HUMAN_INT = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def vllm_default_max_num_seqs(memory_bytes: int, gpu_name: str | None) -> int:
    """vLLM's API-server default (`get_batch_defaults`, 0.26 and 0.32); an unknown name counts as no A100."""
    if memory_bytes >= 160 * GIB:
        return 1024
    if memory_bytes >= 70 * GIB and "a100" not in (gpu_name or "").lower():
        return 1024
    return 256


def parse_vllm_bytes(text: str) -> int:
    """vLLM's `human_readable_int` (utils/argparse_utils.py): 'k', 'm', 'g', 't' are decimal, 'K', 'M', 'G', 'T'
    binary (so 6g is 6e9 bytes, 6G is 6 GiB), a plain number is bytes."""
    value = text.strip()
    m = _HUMAN_INT.fullmatch(value)
    try:
        if m is None:
            return int(value)
        number, suffix = m.groups()
        if suffix in _DECIMAL:
            return int(float(number) * _DECIMAL[suffix])
        return int(number) * _BINARY[suffix]
    except ValueError:
        raise InputError(f"{KV_CACHE_FLAG} {text}: accepted: bytes, or a number with k, m, g, t (decimal) or "
                         "K, M, G, T (binary; whole numbers only)") from None


def kv_cache_flag(args: tuple[str, ...]) -> int | None:
    """The last `--kv-cache-memory-bytes` among an engine's vLLM flags (vLLM takes the last), in bytes."""
    found = None
    for i, arg in enumerate(args):
        if arg == KV_CACHE_FLAG and i + 1 < len(args):
            found = args[i + 1]
        elif arg.startswith(KV_CACHE_FLAG + "="):
            found = arg.split("=", 1)[1]
    return None if found is None else parse_vllm_bytes(found)


@dataclass(frozen=True, kw_only=True)
class SeqsFit:
    vllm_default: int | None  # vLLM's own max_num_seqs on this GPU; None: no GPU known (nothing checked)
    num_blocks: int | None  # the pool's blocks: exact from --kv-cache-memory-bytes, else plan's estimate
    is_exact: bool = False

    @property
    def is_checked(self) -> bool:
        return self.vllm_default is not None and self.num_blocks is not None

    @property
    def usable_blocks(self) -> int:
        blocks = self.num_blocks or 0
        return blocks if self.is_exact else int(STATE_HEADROOM * blocks)

    @property
    def cap(self) -> int | None:
        """What launch writes; None: vLLM's default fits, no block fits at all (vLLM says why), or not checked."""
        if not self.is_checked or self.vllm_default <= self.usable_blocks or self.usable_blocks < 1:
            return None
        return self.usable_blocks

    @property
    def reason(self) -> str:
        if not self.is_checked:
            return ("vLLM's default; not checked against the GDN state blocks, one per sequence (no GPU memory known "
                    "here; --gpu-memory GiB|h200 checks it)")
        where = (f"the {self.num_blocks:,} state blocks its {KV_CACHE_FLAG} holds" if self.is_exact else
                 f"{STATE_HEADROOM:.0%} of the ~{self.num_blocks:,} state blocks plan estimates for its share (weights "
                 f"only; {KV_CACHE_FLAG} makes it exact)")
        if self.usable_blocks < 1:
            return f"vLLM's default ({self.vllm_default:,}): no state block fits by {where}"
        if self.cap is None:
            return f"vLLM's default ({self.vllm_default:,}), within {where}"
        return (f"vLLM's default {self.vllm_default:,} exceeds {where}: vLLM would refuse to capture CUDA graphs "
                "(one state block per decode sequence)")


def fixed_kv_blocks(model: str, kv_cache_bytes: str) -> int:
    """The blocks `--kv-cache-memory-bytes VALUE` holds in a CUDA engine of launch's cache defaults (TP 1): the cap
    launch writes for it, for the benchmarks that give every engine of a comparison the same one."""
    from hybridserve.core.launch.instance_cache import instance_cache
    from hybridserve.core.launch.topology import Device, EngineInstance, EngineOptions

    layout = instance_cache(load_model(model), Device.CUDA, EngineOptions(),
                            EngineInstance(port=1, side_channel_port=2)).layout
    return blocks_held(layout, parse_vllm_bytes(kv_cache_bytes))


def seqs_fit(layout: RankLayout, *, engine_args: tuple[str, ...], memory_bytes: int | None, share: float | None,
             gpu_name: str | None) -> SeqsFit | None:
    """For a CUDA engine with full graphs; None for a model without GDN layers (or no share and no fixed cache)."""
    if layout.gdn is None:
        return None
    if memory_bytes is None:
        return SeqsFit(vllm_default=None, num_blocks=None)
    default = vllm_default_max_num_seqs(memory_bytes, gpu_name)
    kv_bytes = kv_cache_flag(engine_args)
    if kv_bytes is not None:
        return SeqsFit(vllm_default=default, num_blocks=blocks_held(layout, kv_bytes), is_exact=True)
    if share is None:
        return None
    capacity = plan_capacity(layout, MemoryBudget(device_memory_bytes=memory_bytes, gpu_memory_utilization=share))
    return SeqsFit(vllm_default=default, num_blocks=capacity.num_blocks, is_exact=False)
