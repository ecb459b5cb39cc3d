"""dispatch: what a runtime calls. Loads a tuned profile and runs, for a batch, the winner of the nearest bucket."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from hybridserve.core.common.errors import CouldNotRunError, InputError
from hybridserve.kernels import registry
from hybridserve.kernels.tuned_profile import Choice, TunedEntry, TunedProfile, read_profile


class Dispatch:
    def __init__(self, profile: TunedProfile) -> None:
        if not profile.entries:
            raise InputError("tuned profile has no entries; run `hybridserve tune` again")
        self.profile = profile

    @classmethod
    def from_file(cls, path: str | Path) -> Dispatch:
        return cls(read_profile(Path(path)))

    def nearest(self, *, num_key_heads: int, num_value_heads: int, seqlens: list[int]) -> TunedEntry:
        """Same heads; then the closest bucket in log(num_seqs) + log(mean length). Empty sequences do not count."""
        num_seqs = max(1, sum(1 for n in seqlens if n > 0))
        return self.nearest_bucket(num_key_heads=num_key_heads, num_value_heads=num_value_heads, num_seqs=num_seqs,
                                   num_tokens=sum(seqlens))

    def nearest_bucket(self, *, num_key_heads: int, num_value_heads: int, num_seqs: int,
                       num_tokens: int) -> TunedEntry:
        """As `nearest`, from host-side counts only (a server knows them without reading cu_seqlens)."""
        rows = [e for e in self.profile.entries
                if (e.num_key_heads, e.num_value_heads) == (num_key_heads, num_value_heads)]
        if not rows:
            known = sorted({(e.num_key_heads, e.num_value_heads) for e in self.profile.entries})
            raise InputError(f"heads {num_key_heads}/{num_value_heads}: not in the tuned profile; tuned "
                             f"key/value heads: {', '.join(f'{k}/{v}' for k, v in known)}")
        num_seqs = max(1, num_seqs)
        mean_len = max(1.0, num_tokens / num_seqs)

        def distance(e: TunedEntry) -> float:
            return abs(math.log(num_seqs / e.num_seqs)) + abs(math.log(mean_len / e.seq_len))

        return min(rows, key=distance)

    def choose(self, *, num_key_heads: int, num_value_heads: int, seqlens: list[int]) -> Choice:
        """The bucket's winner, or the next fastest verified setting whose backend is available here."""
        entry = self.nearest(num_key_heads=num_key_heads, num_value_heads=num_value_heads, seqlens=seqlens)
        for choice in entry.ranked or (entry.winner,):
            if choice.backend in registry.backend_names() and registry.get_backend(choice.backend).availability().is_ok:
                return choice
        raise CouldNotRunError(f"no backend of the tuned bucket {entry.num_seqs}x{entry.seq_len} is available here "
                               f"({', '.join(c.label for c in entry.ranked)})")

    def prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                cu_seqlens: torch.Tensor, scale: float | None = None, initial_state: torch.Tensor | None = None,
                output_final_state: bool = True, seqlens: list[int] | None = None):
        """Run the chosen backend; pass `seqlens` (host-side lengths) to avoid a device sync."""
        lengths = seqlens if seqlens is not None else (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
        choice = self.choose(num_key_heads=k.shape[1], num_value_heads=v.shape[1], seqlens=lengths)
        return registry.get_backend(choice.backend).prefill(
            q, k, v, g, beta, cu_seqlens, scale, initial_state, output_final_state,
            max_seqlen=max(lengths, default=0), **dict(choice.knobs))
