"""Fused Triton gated-delta-rule prefill kernel (issue 7; owned by the issue-7 engineer).

One program per (work item, value head, value slice BV) walks the chunks of its tokens, keeping the recurrent
state S [dk, BV] in registers across chunks. Per chunk of C tokens (the chunked form of kernels/chunk_torch.py):

    G      = cumsum(g)                                      in-chunk log decay
    A_ij   = beta_i exp(G_i - G_j) k_i.k_j   (j < i)        T = (I + A)^-1, solved in-kernel (`_unit_lower_inverse`)
    U      = T (beta * (V - exp(G) * (K S)))                 corrected values
    o      = scale * (exp(G) * (Q S) + (QK^T * exp(G_i - G_j), i >= j) U)
    S     <- exp(G_last) S + (K * exp(G_last - G))^T U

so one launch reads q, k, v, g, beta once and writes o and the final state: no intermediate tensor in HBM.
Dots run on tensor cores in the input dtype (DOT: bf16/fp16) with fp32 accumulation; the state stays fp32 and
is cast to DOT only as a dot operand (as fla does). Triton's CPU interpreter multiplies bf16 operands as their raw
uint16 bits, so under TRITON_INTERPRET=1 the host sets UPCAST: operands are rounded to DOT, then widened to fp32.

The same kernel serves whole sequences (PASS = WHOLE, one program row per sequence) and the context-parallel passes
of kernels/fused_triton_cp.py, whose rows are (sequence, segment) pairs computed from cu_seqlens in-kernel (no host
sync). TRANSITION walks with v = 0 from S = I[:, slice]: the result is that slice of the segment's state transition
matrix M (S_end = M S_start + S_local).
"""

from __future__ import annotations

import triton
import triton.language as tl

WHOLE: tl.constexpr = tl.constexpr(0)
LOCAL: tl.constexpr = tl.constexpr(1)
TRANSITION: tl.constexpr = tl.constexpr(2)
OUTPUT: tl.constexpr = tl.constexpr(3)
# Operand type of the value-side dots (T (beta V - ...), P U, K^T U): fp16 keeps 3 more mantissa bits than bf16 at
# the same tensor-core rate; these operands are bounded (|T|, |P| <= ~1, U ~ V).
VAL: tl.constexpr = tl.constexpr(tl.float16)


@triton.jit
def _op(x, DOT: tl.constexpr, UPCAST: tl.constexpr):
    """x as a dot operand: rounded to DOT (and, under the interpreter, widened back to fp32)."""
    if UPCAST:
        return x.to(DOT).to(tl.float32)
    else:
        return x.to(DOT)


@triton.jit
def _diag_block_inverse(a, lc, BLK: tl.constexpr):
    """X with I + X = (I + A_d)^-1 for the BLK x BLK diagonal blocks of strictly lower A [C, C] (fp32).

    Forward substitution, all C / BLK blocks at once: step r updates row r of every block,
    X_i <- X_i + sum_j X_ij X_j, where X starts as -A_d and rows j < i of the block are already final."""
    rows = lc[:, None]
    cols = lc[None, :]
    same_block = (rows // BLK) == (cols // BLK)
    x = tl.where(same_block, -a, 0.0)
    for r in range(1, BLK):
        is_row = (rows % BLK) == r
        coef = tl.sum(tl.where(is_row, x, 0.0), axis=0)  # coef[j] = X[i(j), j], i(j) the active row of j's block
        contrib = tl.sum(coef[:, None] * x, axis=0)  # contrib[c] = sum_j coef[j] X[j, c] (X is block-diagonal)
        x = tl.where(is_row & same_block, x + contrib[None, :], x)
    return x


@triton.jit
def _unit_lower_inverse(a, lc, C: tl.constexpr, BLK: tl.constexpr, LOG_NB: tl.constexpr):
    """(I + A)^-1 for strictly lower A [C, C] fp32. I + A = (I + A_d)(I + N) with D = (I + A_d)^-1 from the
    diagonal blocks and N = D A_off strictly block-lower (N^(C/BLK) = 0), so
    (I + A)^-1 = (I - N)(I + N^2)(I + N^4)... D: block merges by fp16 tensor-core dots (fp32 accumulation).
    lc is the in-chunk index 0..C-1 computed inside the chunk loop: masks built from tl.arange alone are
    loop-invariant, get hoisted out of the loop and hold [C, C] registers for its whole length (they spilled)."""
    rows = lc[:, None]
    cols = lc[None, :]
    eye = tl.where(rows == cols, 1.0, 0.0)
    d = eye + _diag_block_inverse(a, lc, BLK)
    if C > BLK:
        a_off = tl.where((rows // BLK) != (cols // BLK), a, 0.0)
        n = tl.dot(d.to(tl.float16), a_off.to(tl.float16))
        t = eye - n
        for _ in tl.static_range(LOG_NB - 1):
            n = tl.dot(n.to(tl.float16), n.to(tl.float16))
            t = tl.dot(t.to(tl.float16), (eye + n).to(tl.float16))
        d = tl.dot(t.to(tl.float16), d.to(tl.float16))
    return d


@triton.jit
def _work_item(cu_seqlens, i_item, seg_len, max_segs, PASS: tl.constexpr):
    """(bos, eos, n, j, count, active) of program row i_item: a whole sequence (PASS 0) or segment j of sequence n
    (CP passes; row = n * max_segs + j, rows past a sequence's segments, or not in this pass, are inactive)."""
    if PASS == WHOLE:
        n = i_item
        j = 0
    else:
        n = i_item // max_segs
        j = i_item % max_segs
    start = tl.load(cu_seqlens + n).to(tl.int32)
    end = tl.load(cu_seqlens + n + 1).to(tl.int32)
    if PASS == WHOLE:
        bos = start
        eos = end
        count = 1
    else:
        count = tl.maximum(tl.cdiv(end - start, seg_len), 1)
        bos = start + j * seg_len
        eos = tl.minimum(bos + seg_len, end)
    active = j < count
    if PASS == LOCAL:
        active = j < count - 1
    if PASS == TRANSITION:
        active = (j >= 1) & (j < count - 1)
    return bos, eos, n, j, count, active


@triton.jit
def _load_state(h0, h_mid, i_item, n, j, i_h, o_k, o_v, HV, DK: tl.constexpr, DV: tl.constexpr,
                BV: tl.constexpr, HAS_INIT: tl.constexpr, PASS: tl.constexpr):
    """The start state slice [DK, BV]: the initial state for a sequence's first range, the combined start state
    (h_mid) for later output segments, zero for later local segments, I[:, slice] for transitions."""
    s = tl.zeros([DK, BV], dtype=tl.float32)
    offs = o_k[:, None] * DV + o_v[None, :]
    if PASS == TRANSITION:
        s = tl.where(o_k[:, None] == o_v[None, :], 1.0, 0.0)
    elif j == 0:
        if HAS_INIT:
            s = tl.load(h0 + (n.to(tl.int64) * HV + i_h) * DK * DV + offs)
    elif PASS == OUTPUT:
        s = tl.load(h_mid + (i_item.to(tl.int64) * HV + i_h) * DK * DV + offs)
    return s


@triton.jit
def _write_output(q, o, rows64, valid, lc, i_kh, i_h, o_k, o_v, kc, s_op, u, gcum, egc, scale, HK, HV,
                  DK: tl.constexpr, DV: tl.constexpr, DOT: tl.constexpr, UPCAST: tl.constexpr):
    """o = scale * (exp(G) * (Q S) + (QK^T * exp(G_i - G_j), i >= j) U) for the chunk's valid rows."""
    qc = tl.load(q + (rows64[:, None] * HK + i_kh) * DK + o_k[None, :], mask=valid[:, None], other=0.0)
    qc = _op(qc, DOT, UPCAST)
    qk = tl.dot(qc, tl.trans(kc))
    causal = lc[:, None] >= lc[None, :]
    p = tl.where(causal, qk * tl.exp(tl.where(causal, gcum[:, None] - gcum[None, :], 0.0)), 0.0)
    oc = egc[:, None] * tl.dot(qc, s_op) + tl.dot(_op(p, VAL, UPCAST), u)
    tl.store(o + (rows64[:, None] * HV + i_h) * DV + o_v[None, :], (oc * scale).to(o.dtype.element_ty),
             mask=valid[:, None])


@triton.jit
def _store_state(ht, s, i_item, n, j, count, i_h, o_k, o_v, HV, DK: tl.constexpr, DV: tl.constexpr,
                 PASS: tl.constexpr):
    """The end state: a sequence's final state (WHOLE, or the last OUTPUT segment) into ht[n]; the LOCAL end state
    or the TRANSITION matrix slice into ht[program row]."""
    offs = (o_k * DV)[:, None] + o_v[None, :]  # not the load's expression: CSE would keep it live over the loop
    if PASS == WHOLE:
        tl.store(ht + (n.to(tl.int64) * HV + i_h) * DK * DV + offs, s)
    elif PASS == OUTPUT:
        if j == count - 1:
            tl.store(ht + (n.to(tl.int64) * HV + i_h) * DK * DV + offs, s)
    else:
        tl.store(ht + (i_item.to(tl.int64) * HV + i_h) * DK * DV + offs, s)


@triton.jit
def gdn_walk_kernel(
    q, k, v, g, beta, o, h0, h_mid, ht, cu_seqlens, scale, HK, HV, seg_len, max_segs,
    DK: tl.constexpr, DV: tl.constexpr, C: tl.constexpr, BV: tl.constexpr, BLK: tl.constexpr,
    LOG_NB: tl.constexpr, HAS_INIT: tl.constexpr, PASS: tl.constexpr, WRITE_O: tl.constexpr, DOT: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """PASS: WHOLE (one program row per sequence: o and final state), or the context-parallel passes LOCAL (end
    state from a zero start, into ht[row]), TRANSITION (M[:, slice] into ht[row]) and OUTPUT (o from the combined
    start states in h_mid; final state of a sequence's last segment into ht[n])."""
    i_item, i_h, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    bos, eos, n, j, count, active = _work_item(cu_seqlens, i_item, seg_len, max_segs, PASS)
    if not active:
        return
    i_kh = i_h // (HV // HK)  # GVA: contiguous groups of value heads share a key head
    o_c = tl.arange(0, C)
    o_k = tl.arange(0, DK)
    o_v = i_v * BV + tl.arange(0, BV)
    s = _load_state(h0, h_mid, i_item, n, j, i_h, o_k, o_v, HV, DK, DV, BV, HAS_INIT, PASS)
    for t0 in range(bos, eos, C):
        rows = t0 + o_c
        valid = rows < eos
        lc = (rows - bos) % C  # == o_c, but loop-variant to the compiler (see _unit_lower_inverse)
        rows64 = rows.to(tl.int64)
        kc = tl.load(k + (rows64[:, None] * HK + i_kh) * DK + o_k[None, :], mask=valid[:, None], other=0.0)
        gc = tl.load(g + rows64 * HV + i_h, mask=valid, other=0.0).to(tl.float32)
        bc = tl.load(beta + rows64 * HV + i_h, mask=valid, other=0.0).to(tl.float32)
        gcum = tl.cumsum(gc, axis=0)
        egc = tl.exp(gcum)
        # padded rows have g = beta = 0, k = 0: they change nothing, and G_last = G[C - 1]
        g_last = tl.sum(tl.where(o_c == C - 1, gcum, 0.0), axis=0)
        kc = _op(kc, DOT, UPCAST)
        kk = tl.dot(kc, tl.trans(kc))
        strict = lc[:, None] > lc[None, :]
        a = tl.where(strict, bc[:, None] * tl.exp(tl.where(strict, gcum[:, None] - gcum[None, :], 0.0)) * kk, 0.0)
        t_inv = _unit_lower_inverse(a, lc, C, BLK, LOG_NB)
        s_op = _op(s, DOT, UPCAST)
        ks = tl.dot(kc, s_op)
        if PASS == TRANSITION:
            rhs = -(bc * egc)[:, None] * ks
        else:
            vc = tl.load(v + (rows64[:, None] * HV + i_h) * DV + o_v[None, :], mask=valid[:, None], other=0.0)
            rhs = bc[:, None] * (vc.to(tl.float32) - egc[:, None] * ks)
        u = _op(tl.dot(_op(t_inv, VAL, UPCAST), _op(rhs, VAL, UPCAST)), VAL, UPCAST)
        if WRITE_O:
            _write_output(q, o, rows64, valid, lc, i_kh, i_h, o_k, o_v, kc, s_op, u, gcum, egc, scale, HK, HV,
                          DK, DV, DOT, UPCAST)
        # S <- exp(G_last) S + K^T (exp(G_last - G) * U): the decay scales U [C, BV] rather than K [C, DK], so K
        # is only ever a dot operand and never needs a register copy
        ud = _op(u.to(tl.float32) * tl.exp(g_last - gcum)[:, None], VAL, UPCAST)
        s = s * tl.exp(g_last) + tl.dot(tl.trans(_op(kc, VAL, UPCAST)), ud)
    _store_state(ht, s, i_item, n, j, count, i_h, o_k, o_v, HV, DK, DV, PASS)
