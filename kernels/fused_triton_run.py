"""Host side of the issue-7 fused Triton kernel: checks, the launch for whole sequences, the knobs.

`gdn_prefill` has the judge's signature (kernels/naive.py) plus the knobs; with `cp_segment` set, sequences longer
than one segment go through the context-parallel passes of kernels/fused_triton_cp.py.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

import triton.language as tl

from hybridserve.kernels.fused_triton import gdn_walk_kernel

WHOLE, LOCAL, TRANSITION, OUTPUT = 0, 1, 2, 3  # the kernel's PASS values
_DOT_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


def is_interpreted() -> bool:
    """Triton's CPU interpreter multiplies bf16 dot operands as raw bits: the kernel then widens them to fp32."""
    return os.environ.get("TRITON_INTERPRET") == "1"


@dataclass(frozen=True, kw_only=True)
class FusedKnobs:
    chunk_size: int = 64  # C: tokens per chunk (16..128, power of two)
    block_v: int = 64  # BV: value columns per program (the state slice is [dk, BV])
    num_warps: int = 4
    num_stages: int = 1
    solve_block: int = 16  # diagonal block of the in-kernel triangular solve
    cp_segment: int = 0  # tokens per context-parallel segment (a multiple of chunk_size); 0: off

    def check(self, dk: int, dv: int) -> None:
        for name, value, least in (("chunk_size", self.chunk_size, 16), ("block_v", self.block_v, 16),
                                   ("solve_block", self.solve_block, 4)):
            if value < least or value & (value - 1):
                raise ValueError(f"{name}={value}: must be a power of two >= {least}")
        if self.solve_block > self.chunk_size:
            raise ValueError(f"solve_block={self.solve_block} exceeds chunk_size={self.chunk_size}")
        if dv % self.block_v:
            raise ValueError(f"block_v={self.block_v} does not divide the value head size {dv}")
        if dk < 16 or dk & (dk - 1):
            raise ValueError(f"key head size {dk}: must be a power of two >= 16")
        if self.cp_segment and (self.cp_segment % self.chunk_size or dk != dv or dk % self.block_v):
            raise ValueError(f"cp_segment={self.cp_segment}: needs a multiple of chunk_size and dk == dv")


def launch_walk(x: dict, cu_seqlens: torch.Tensor, num_rows: int, out: torch.Tensor, h0: torch.Tensor | None,
                ht: torch.Tensor, knobs: FusedKnobs, *, pass_id: int = WHOLE, h_mid: torch.Tensor | None = None,
                max_segs: int = 1) -> None:
    """One launch of the walk kernel over `num_rows` program rows (sequences, or sequence x segment pairs)."""
    q, k, v = x["q"], x["k"], x["v"]
    hk, dk, hv, dv = k.shape[1], k.shape[2], v.shape[1], v.shape[2]
    if num_rows == 0:
        return
    width = dk if pass_id == TRANSITION else dv
    grid = (num_rows, hv, width // knobs.block_v)
    gdn_walk_kernel[grid](
        q, k, v, x["g"], x["beta"], out, ht if h0 is None else h0, ht if h_mid is None else h_mid, ht, cu_seqlens,
        x["scale"], hk, hv, max(knobs.cp_segment, 1), max_segs,
        DK=dk, DV=dv, C=knobs.chunk_size, BV=knobs.block_v, BLK=knobs.solve_block,
        LOG_NB=max(int(math.log2(knobs.chunk_size // knobs.solve_block)), 1), HAS_INIT=h0 is not None,
        PASS=pass_id, WRITE_O=pass_id in (WHOLE, OUTPUT), DOT=_DOT_DTYPES[q.dtype], UPCAST=is_interpreted(),
        num_warps=knobs.num_warps, num_stages=knobs.num_stages,
    )


def _prepare(q, k, v, g, beta, scale) -> dict:
    dk = k.shape[2]
    if q.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"inputs {q.dtype}: the fused kernel takes bfloat16 or float16")
    if v.shape[1] % k.shape[1]:
        raise ValueError(f"value heads {v.shape[1]} are not a multiple of key heads {k.shape[1]}")
    return dict(q=q.contiguous(), k=k.contiguous(), v=v.contiguous(), g=g.float().contiguous(),
                beta=beta.float().contiguous(), scale=float(dk**-0.5 if scale is None else scale))


def gdn_prefill(q, k, v, g, beta, cu_seqlens, scale=None, initial_state=None, output_final_state=True,
                knobs: FusedKnobs | None = None, max_seqlen: int | None = None,
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(o [T, Hv, dv] in q's dtype, final_state [N, Hv, dk, dv] float32 or None)."""
    knobs = knobs or FusedKnobs()
    knobs.check(k.shape[2], v.shape[2])
    x = _prepare(q, k, v, g, beta, scale)
    num_seqs, hv, dk, dv = cu_seqlens.shape[0] - 1, v.shape[1], k.shape[2], v.shape[2]
    out = torch.empty_like(x["v"], dtype=q.dtype)
    final = torch.empty(num_seqs, hv, dk, dv, dtype=torch.float32, device=q.device)
    h0 = None if initial_state is None else initial_state.float().contiguous()
    cu = cu_seqlens.to(torch.int32)
    if knobs.cp_segment and max_seqlen is None:
        max_seqlen = int((cu[1:] - cu[:-1]).max()) if num_seqs else 0  # one host sync; callers pass it
    if knobs.cp_segment and max_seqlen > knobs.cp_segment:
        from hybridserve.kernels.fused_triton_cp import run_context_parallel

        run_context_parallel(x, cu, max_seqlen, out, h0, final, knobs)
    else:
        launch_walk(x, cu, num_seqs, out, h0, final, knobs)
    return out, (final if output_final_state else None)
