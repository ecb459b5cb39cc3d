"""Context-parallel passes of the issue-7 fused kernel: for few sequences x heads (long prompts at high TP).

Each sequence is cut into segments of `cp_segment` tokens. The walk is linear in its start state, so a segment's
end state is S_end = M S_start + S_local, with M the segment's state transition [dk, dk] (kernels/fused_triton.py,
TRANSITION mode) and S_local the end state from a zero start. Four launches:

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

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from hybridserve.kernels.fused_triton_run import FusedKnobs, launch_walk


@triton.jit
def combine_kernel(e_buf, m_buf, b_buf, seq_first, seq_count,
                   HV: tl.constexpr, DK: tl.constexpr, BV: tl.constexpr):
    i_p, i_h, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    first = tl.load(seq_first + i_p).to(tl.int64)
    count = tl.load(seq_count + i_p).to(tl.int64)
    o_k = tl.arange(0, DK)
    o_v = i_v * BV + tl.arange(0, BV)
    slice_off = o_k[:, None] * DK + o_v[None, :]
    s = tl.load(e_buf + (first * HV + i_h) * DK * DK + slice_off)
    tl.store(b_buf + ((first + 1) * HV + i_h) * DK * DK + slice_off, s)
    for j in range(first + 1, first + count - 1):
        m = tl.load(m_buf + (j * HV + i_h) * DK * DK + o_k[:, None] * DK + o_k[None, :])
        s = tl.dot(m, s, input_precision="tf32x3") + tl.load(e_buf + (j * HV + i_h) * DK * DK + slice_off)
        tl.store(b_buf + ((j + 1) * HV + i_h) * DK * DK + slice_off, s)


@dataclass(frozen=True, kw_only=True)
class CpPlan:
    """Work items (bos, eos, init_row, final_row) of each pass, and the sequences that need combining."""

    num_segments: int
    first_segment: tuple[int, ...]  # per sequence
    local: tuple[tuple[int, ...], ...]
    transition: tuple[tuple[int, ...], ...]
    output: tuple[tuple[int, ...], ...]
    combine: tuple[tuple[int, ...], ...]  # (first segment, segment count) of sequences with >= 2 segments


def plan(cu: list[int], segment: int, has_init: bool) -> CpPlan:
    local, transition, output, combine, firsts = [], [], [], [], []
    s = 0
    for n in range(len(cu) - 1):
        length = cu[n + 1] - cu[n]
        count = max(1, -(-length // segment))
        firsts.append(s)
        if count > 1:
            combine.append((s, count))
        for j in range(count):
            bos, eos = cu[n] + j * segment, min(cu[n] + (j + 1) * segment, cu[n + 1])
            starts_known = j > 0 or has_init
            if j < count - 1:
                local.append((bos, eos, s if j == 0 and has_init else -1, s))
                if j > 0:
                    transition.append((bos, eos, -1, s))
            output.append((bos, eos, s if starts_known else -1, n if j == count - 1 else -1))
            s += 1
    return CpPlan(num_segments=s, first_segment=tuple(firsts), local=tuple(local), transition=tuple(transition),
                  output=tuple(output), combine=tuple(combine))


def _items(rows, device) -> tuple[torch.Tensor, ...]:
    t = torch.tensor(rows, dtype=torch.int32).reshape(-1, 4).t().contiguous().to(device)
    return tuple(t[i] for i in range(4))


def run_context_parallel(x: dict, cu_seqlens: torch.Tensor, out: torch.Tensor, h0: torch.Tensor | None,
                         final: torch.Tensor, knobs: FusedKnobs) -> None:
    """Fill `out` and `final` (see the module docstring); one host sync to read the sequence lengths."""
    device, hv, dk = out.device, out.shape[1], out.shape[2]
    p = plan([int(c) for c in cu_seqlens.tolist()], knobs.cp_segment, h0 is not None)
    starts = torch.empty(p.num_segments, hv, dk, dk, dtype=torch.float32, device=device)
    if h0 is not None:
        starts[torch.tensor(p.first_segment, dtype=torch.long, device=device)] = h0
    if p.combine:
        ends = torch.empty_like(starts)
        launch_walk(x, _items(p.local, device), out, starts, ends, knobs, write_o=False)
        mats = torch.empty_like(starts)
        launch_walk(x, _items(p.transition, device), out, None, mats, knobs, write_o=False, transition=True)
        first, count = (torch.tensor(c, dtype=torch.int32, device=device) for c in zip(*p.combine))
        combine_kernel[(len(p.combine), hv, dk // knobs.block_v)](
            ends, mats, starts, first, count, HV=hv, DK=dk, BV=knobs.block_v, num_warps=8)
    launch_walk(x, _items(p.output, device), out, starts, final, knobs)
