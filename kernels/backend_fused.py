"""The `fused_triton` backend: the project's own fused Triton GDN prefill kernel (issue 7).

Takes the project's convention as is (log-space gate, [N, Hv, dk, dv] float32 state, GVA). Runs on CUDA GPUs of
compute capability >= 8.0, and on CPU tensors under Triton's interpreter (TRITON_INTERPRET=1), which is how CI
checks it. Knobs: chunk_size, block_v (value slice per program), num_warps, num_stages, cp_segment (tokens per
context-parallel segment, 0 = one program walks the whole sequence).
"""

from __future__ import annotations

import functools
import importlib
import os
from typing import Any

import torch

from hybridserve.kernels.backend import OK, Backend, Capabilities, KnobSetting, Support
from hybridserve.kernels.inputs import GdnShape

NUM_SMS_H200 = 132  # the heuristic's target; a knob sweep (tune) corrects it on other GPUs
CP_SEGMENTS = (512, 1024, 2048)


def is_interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


@functools.cache
def _load() -> Any:
    return importlib.import_module("hybridserve.kernels.fused_triton_run")


def default_knobs(shape: GdnShape) -> KnobSetting:
    """One program per (sequence, value head, 64-wide value slice) when that fills the GPU; else split the long
    sequences into context-parallel segments so that segments x heads x slices covers about two waves.

    32-token chunks at 8 warps with 8 x 8 diagonal solve blocks: compiled without register spills for sm_90 (ptxas
    through Triton 3.6, BENCHMARKS.md) and 7 sequential substitution steps per chunk instead of 15; not yet timed
    on a GPU, so `tune` should decide."""
    slices = shape.value_head_dim // 64 if shape.value_head_dim >= 64 else 1
    block_v = min(64, shape.value_head_dim)
    programs = shape.num_seqs * shape.num_value_heads * slices
    longest = max(shape.seqlens, default=0)
    base: KnobSetting = (("chunk_size", 32), ("block_v", block_v), ("num_warps", 8), ("solve_block", 8))
    if programs >= NUM_SMS_H200 or longest < 2048 or shape.key_head_dim != shape.value_head_dim:
        return base
    want_segments = -(-2 * NUM_SMS_H200 // (shape.num_value_heads * slices))
    segment = max(512, min(4096, 1 << max(longest // want_segments, 1).bit_length() - 1))
    return base + (("cp_segment", segment),)


class FusedTritonBackend(Backend):
    name = "fused_triton"

    @property
    def capabilities(self) -> Capabilities:  # CPU tensors only through Triton's interpreter
        return Capabilities(
            devices=frozenset({"cuda", "cpu"} if is_interpreted() else {"cuda"}),
            dtypes=frozenset({torch.bfloat16, torch.float16}),
            head_dims=frozenset({16, 32, 64, 128}),
            min_compute_capability=(8, 0),
        )

    def availability(self) -> Support:
        try:
            _load()
        except Exception as exc:
            return Support(is_ok=False, reason=f"triton not importable ({type(exc).__name__}: {exc})"[:160])
        if not torch.cuda.is_available() and not is_interpreted():
            return Support(is_ok=False, reason="needs a CUDA GPU (or TRITON_INTERPRET=1 on CPU tensors)")
        return OK

    def supports(self, shape: GdnShape, dtype: torch.dtype, device: torch.device) -> Support:
        if device.type == "cpu" and not is_interpreted():
            return Support(is_ok=False, reason="CPU tensors need TRITON_INTERPRET=1 (Triton's interpreter)")
        if device.type == "cuda" and is_interpreted():
            return Support(is_ok=False, reason="TRITON_INTERPRET=1 runs CPU tensors only")
        return super().supports(shape, dtype, device)

    def knob_space(self, shape: GdnShape) -> list[KnobSetting]:
        first = default_knobs(shape)
        settings = [first]
        if shape.value_head_dim < 128:
            return settings
        longest = max(shape.seqlens, default=0)
        settings += [(("chunk_size", 32), ("block_v", 64), ("num_warps", 8), ("solve_block", 4)),
                     (("block_v", 64),), (("block_v", 32),), (("block_v", 64), ("num_warps", 8)),
                     (("block_v", 128), ("num_warps", 8)), (("chunk_size", 32), ("block_v", 64), ("num_warps", 8)),
                     (("chunk_size", 32), ("block_v", 32), ("num_warps", 8))]
        if shape.key_head_dim == shape.value_head_dim:
            settings += [(("block_v", 64), ("cp_segment", n)) for n in CP_SEGMENTS if n < longest]
            settings += [(("chunk_size", 32), ("block_v", bv), ("num_warps", 8), ("cp_segment", n))
                         for bv in (64, 32) for n in CP_SEGMENTS[1:] if n < longest]
        return list(dict.fromkeys(settings))

    def prefill(self, q, k, v, g, beta, cu_seqlens, scale=None, initial_state=None, output_final_state=True,
                max_seqlen=None, **knobs: Any):
        run = _load()
        return run.gdn_prefill(q, k, v, g, beta, cu_seqlens, scale, initial_state, output_final_state,
                               knobs=run.FusedKnobs(**knobs), max_seqlen=max_seqlen)
