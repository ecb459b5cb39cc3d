"""Context-parallel passes of the issue-7 fused kernel: for few sequences x heads (long prompts at high TP).

Each sequence is cut into segments of `cp_segment` tokens; program row n * max_segs + j is segment j of sequence
n. The walk is linear in its start state, so a segment's end state is S_end = M S_start + S_local, with M the
segment's state transition [dk, dk] (kernels/fused_triton.py, TRANSITION pass) and S_local the end state from a
zero start. Four launches:

  1. local:      every segment but a sequence's last, in parallel: S_local (segment 0 starts from the real
                 initial state, so its result is already its true end state);
  2. transition: segments 1 .. m-2 of each sequence, in parallel: M;
  3. combine:    per (sequence, head, value slice), sequentially over segments:
                 S_start[j+1] = M_j S_start[j] + S_local[j]  ([dk, dk] x [dk, BV], fp32 through tf32x3 dots);
  4. output:     every segment in parallel from its true start state: o, and the final state for last segments.

Work: passes 1 + 2 + 4 redo about three times the single-walk work, but with segments x heads x slices programs
instead of sequences x heads x slices, which is what fills 132 SMs when there are few sequences.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hybridserve.kernels.fused_triton_run import LOCAL, OUTPUT, TRANSITION, FusedKnobs, launch_walk


@triton.jit
def combine_kernel(e_buf, m_buf, b_buf, cu_seqlens, seg_len, max_segs, HV,
                   DK: tl.constexpr, BV: tl.constexpr):
    """Start states of segments 1 .. count-1 of sequence n: S[1] = E[0]; S[j+1] = M[j] S[j] + E[j]."""
    n, i_h, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    length = tl.load(cu_seqlens + n + 1) - tl.load(cu_seqlens + n)
    count = tl.cdiv(length, seg_len)
    base = n.to(tl.int64) * max_segs
    o_k = tl.arange(0, DK)
    o_v = i_v * BV + tl.arange(0, BV)
    slice_off = o_k[:, None] * DK + o_v[None, :]
    if count > 1:
        s = tl.load(e_buf + (base * HV + i_h) * DK * DK + slice_off)
        tl.store(b_buf + ((base + 1) * HV + i_h) * DK * DK + slice_off, s)
        for j in range(1, count - 1):
            row = (base + j) * HV + i_h
            m = tl.load(m_buf + row * DK * DK + o_k[:, None] * DK + o_k[None, :])
            s = tl.dot(m, s, input_precision="tf32x3") + tl.load(e_buf + row * DK * DK + slice_off)
            tl.store(b_buf + ((base + j + 1) * HV + i_h) * DK * DK + slice_off, s)


def run_context_parallel(x: dict, cu: torch.Tensor, max_seqlen: int, out: torch.Tensor, h0: torch.Tensor | None,
                         final: torch.Tensor, knobs: FusedKnobs) -> None:
    """Fill `out` and `final` (see the module docstring). Program rows are (sequence, segment) pairs, found from
    cu_seqlens in-kernel; `max_seqlen` (a host int) sizes the grid, so there is no host sync."""
    num_seqs, hv, dk = cu.shape[0] - 1, out.shape[1], out.shape[2]
    segment = knobs.cp_segment
    max_segs = -(-max_seqlen // segment)
    rows = num_seqs * max_segs
    ends, starts = (torch.empty(rows, hv, dk, dk, dtype=torch.float32, device=out.device) for _ in range(2))
    launch_walk(x, cu, rows, out, h0, ends, knobs, pass_id=LOCAL, max_segs=max_segs)
    mats = ends
    if max_segs > 2:
        mats = torch.empty_like(ends)
        launch_walk(x, cu, rows, out, None, mats, knobs, pass_id=TRANSITION, max_segs=max_segs)
    combine_kernel[(num_seqs, hv, dk // knobs.block_v)](
        ends, mats, starts, cu, segment, max_segs, hv, DK=dk, BV=knobs.block_v, num_warps=8)
    launch_walk(x, cu, rows, out, h0, final, knobs, pass_id=OUTPUT, h_mid=starts, max_segs=max_segs)
