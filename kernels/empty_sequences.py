"""Empty sequences inside a varlen batch, kept away from kernels that mishandle them.

An empty sequence has no tokens, so its output is nothing and its final state is its initial state (zeros without
one). Measured on the H200: FlashQLA 0.1.3 refuses one (auto_cp=True raises 'invalid sequence lengths', auto_cp=False
returns inf), and FlashInfer 0.6.14's context-parallel kernel (use_cp=True, vLLM 0.26's pin) writes a wrong final
state for it (relative error 0.38-0.45) while its plain kernel is right. Adapters call the kernel on the batch
without its empty sequences and put the initial states back in their rows. vLLM never sends an empty sequence to
GDN prefill, so a served batch pays one device read per cu_seqlens object (the adapters memoise it) and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class NonEmpty:
    """A batch's cu_seqlens without its empty sequences; `kept`: the indices of the sequences left, None when no
    sequence was empty (the batch is passed as it is)."""

    cu_seqlens: torch.Tensor
    kept: torch.Tensor | None
    num_seqs: int

    @property
    def is_all_empty(self) -> bool:
        return self.kept is not None and self.kept.numel() == 0


def drop_empty(cu_seqlens: torch.Tensor) -> NonEmpty:
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    num_seqs = lengths.numel()
    if not bool((lengths == 0).any()):
        return NonEmpty(cu_seqlens, None, num_seqs)
    kept = (lengths > 0).nonzero().squeeze(1)
    return NonEmpty(torch.cat([cu_seqlens[:1], cu_seqlens[1:][kept]]), kept, num_seqs)


def kept_rows(batch: NonEmpty, state: torch.Tensor | None) -> torch.Tensor | None:
    """The initial states of the sequences the kernel sees."""
    return state if batch.kept is None or state is None else state[batch.kept]


def unchanged_states(batch: NonEmpty, initial_state: torch.Tensor | None, like: tuple[int, int, int],
                     device: torch.device) -> torch.Tensor:
    """Every sequence's state as if it had no tokens: [N, Hv, K, V] float32 (`like`: Hv, K, V)."""
    if initial_state is not None:
        return initial_state.float().clone()
    return torch.zeros(batch.num_seqs, *like, dtype=torch.float32, device=device)


def restore_rows(batch: NonEmpty, final: torch.Tensor | None, initial_state: torch.Tensor | None) -> torch.Tensor | None:
    """The kernel's final states in their sequences' rows; an empty sequence's row holds its initial state."""
    if batch.kept is None or final is None:
        return final
    full = unchanged_states(batch, initial_state, tuple(final.shape[1:]), final.device)
    full[batch.kept] = final.to(full.dtype)
    return full
