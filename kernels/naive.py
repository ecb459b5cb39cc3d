"""The judge: the gated delta rule as a plain float64 recurrence, one token at a time.

Convention (DESIGN.md "GDN kernel conventions"): packed varlen inputs `q, k: [T, Hk, dk]`, `v: [T, Hv, dv]`,
`g: [T, Hv]` log-space decay, `beta: [T, Hv]`, `cu_seqlens: [N+1]`, `initial_state: [N, Hv, dk, dv]`; value head j
reads key head `j // (Hv // Hk)`. Per head and token:

    S <- exp(g_t) * S
    S <- S + k_t (beta_t * (v_t - S^T k_t))^T
    o_t = scale * S^T q_t

The sequences of a batch run side by side, padded to the longest one: a padded step has g = 0 and beta = 0, which
leaves the state untouched, and its output is dropped. So a batch costs max(len) steps, not sum(len).
"""

from __future__ import annotations

import torch


def expand_key_heads(x: torch.Tensor, num_value_heads: int) -> torch.Tensor:
    """[T, Hk, d] -> [T, Hv, d]: value head j reads key head j // (Hv // Hk) (contiguous groups, as fla/FlashInfer)."""
    num_key_heads = x.shape[1]
    if num_value_heads % num_key_heads:
        raise ValueError(f"value heads {num_value_heads} are not a multiple of key heads {num_key_heads}")
    return x.repeat_interleave(num_value_heads // num_key_heads, dim=1)


def _pad(x: torch.Tensor, cu: list[int], max_len: int) -> torch.Tensor:
    """Packed [T, ...] -> padded [N, max_len, ...] (zeros after each sequence's end)."""
    out = x.new_zeros((len(cu) - 1, max_len, *x.shape[1:]))
    for i in range(len(cu) - 1):
        out[i, : cu[i + 1] - cu[i]] = x[cu[i] : cu[i + 1]]
    return out


def _unpad(x: torch.Tensor, cu: list[int]) -> torch.Tensor:
    return torch.cat([x[i, : cu[i + 1] - cu[i]] for i in range(len(cu) - 1)], dim=0)


def gdn_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Return (o [T, Hv, dv] float64, final_state [N, Hv, dk, dv] float64 or None)."""
    f64 = torch.float64
    num_value_heads, dk, dv = v.shape[1], k.shape[2], v.shape[2]
    scale = dk**-0.5 if scale is None else scale
    cu = [int(x) for x in cu_seqlens.tolist()]
    num_seqs, max_len = len(cu) - 1, max([b - a for a, b in zip(cu, cu[1:])], default=0)
    qh = _pad(expand_key_heads(q.to(f64), num_value_heads), cu, max_len)
    kh = _pad(expand_key_heads(k.to(f64), num_value_heads), cu, max_len)
    vh, gh, bh = (_pad(x.to(f64), cu, max_len) for x in (v, g, beta))
    state = q.new_zeros((num_seqs, num_value_heads, dk, dv), dtype=f64)
    if initial_state is not None:
        state = initial_state.to(f64).clone()
    out = qh.new_zeros((num_seqs, max_len, num_value_heads, dv))
    for t in range(max_len):
        state = state * torch.exp(gh[:, t])[..., None, None]
        kt = kh[:, t]  # [N, Hv, dk]
        predicted = torch.einsum("nhkv,nhk->nhv", state, kt)
        delta = bh[:, t, :, None] * (vh[:, t] - predicted)
        state = state + kt[..., :, None] * delta[..., None, :]
        out[:, t] = scale * torch.einsum("nhkv,nhk->nhv", state, qh[:, t])
    o = _unpad(out, cu) if num_seqs else out.new_zeros((0, num_value_heads, dv))
    return o, (state if output_final_state else None)
