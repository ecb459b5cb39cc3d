"""Random GDN prefill inputs in the project's convention, shaped like a model's heads under TP."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, kw_only=True)
class GdnShape:
    """Heads and sequence lengths of one prefill call (per TP rank)."""

    seqlens: tuple[int, ...]
    num_key_heads: int
    num_value_heads: int
    key_head_dim: int = 128
    value_head_dim: int = 128

    @property
    def num_tokens(self) -> int:
        return sum(self.seqlens)

    @property
    def num_seqs(self) -> int:
        return len(self.seqlens)

    @property
    def gva_ratio(self) -> int:
        return self.num_value_heads // self.num_key_heads


@dataclass(frozen=True, kw_only=True)
class GdnInputs:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    cu_seqlens: torch.Tensor
    initial_state: torch.Tensor | None
    scale: float

    def as_kwargs(self) -> dict:
        return dict(q=self.q, k=self.k, v=self.v, g=self.g, beta=self.beta, cu_seqlens=self.cu_seqlens,
                    scale=self.scale, initial_state=self.initial_state)


def cu_seqlens_of(seqlens: tuple[int, ...], device: torch.device | str = "cpu") -> torch.Tensor:
    cu = [0]
    for n in seqlens:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int32, device=device)


def make_inputs(
    shape: GdnShape,
    *,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str = "cpu",
    seed: int = 0,
    has_initial_state: bool = True,
) -> GdnInputs:
    """q, k L2-normalised (as the model's prep kernel leaves them); g = log(sigmoid(.)) mostly near 0 so the state
    remembers tens to hundreds of tokens; beta = sigmoid(.); initial state ~ N(0, 0.1) float32."""
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed)  # drawn where used: big GPU inputs never cross PCIe
    t, hk, hv = shape.num_tokens, shape.num_key_heads, shape.num_value_heads

    def randn(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=gen, dtype=torch.float32, device=device)

    q = torch.nn.functional.normalize(randn(t, hk, shape.key_head_dim), dim=-1, eps=1e-6)
    k = torch.nn.functional.normalize(randn(t, hk, shape.key_head_dim), dim=-1, eps=1e-6)
    v = randn(t, hv, shape.value_head_dim)
    g = torch.nn.functional.logsigmoid(randn(t, hv) * 1.5 + 4.0)
    beta = torch.sigmoid(randn(t, hv))
    state = randn(shape.num_seqs, hv, shape.key_head_dim, shape.value_head_dim) * 0.1
    return GdnInputs(
        q=q.to(device=device, dtype=dtype), k=k.to(device=device, dtype=dtype), v=v.to(device=device, dtype=dtype),
        g=g.to(device), beta=beta.to(device), cu_seqlens=cu_seqlens_of(shape.seqlens, device),
        initial_state=state.to(device) if has_initial_state else None, scale=shape.key_head_dim**-0.5,
    )
