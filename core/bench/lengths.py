"""Token-length distributions for prompts and outputs: a fixed length, or uniform over an inclusive range."""

from __future__ import annotations

import random
from dataclasses import dataclass

from hybridserve.core.common.errors import InputError


@dataclass(frozen=True, kw_only=True)
class LengthDist:
    min_tokens: int
    max_tokens: int  # equal to min_tokens for a fixed length

    @property
    def is_fixed(self) -> bool:
        return self.min_tokens == self.max_tokens

    @property
    def mean_tokens(self) -> float:
        return (self.min_tokens + self.max_tokens) / 2

    def sample(self, rng: random.Random, num: int) -> tuple[int, ...]:
        """`num` lengths, each uniform over [min_tokens, max_tokens] (all equal when fixed)."""
        return tuple(rng.randint(self.min_tokens, self.max_tokens) for _ in range(num))

    def __str__(self) -> str:
        return str(self.min_tokens) if self.is_fixed else f"{self.min_tokens}:{self.max_tokens}"


def parse_length(text: str, *, flag: str) -> LengthDist:
    """'1024' (fixed) or '500:12000' (uniform, both ends included); every length at least 1 token."""
    parts = str(text).strip().split(":")
    accepted = "a token count N or a range MIN:MAX (1 <= MIN <= MAX)"
    try:
        values = [int(p.replace("_", "").replace(",", "")) for p in parts]
    except ValueError:
        raise InputError(f"{flag} {text!r}: accepted: {accepted}") from None
    if len(values) not in (1, 2) or min(values) < 1 or values[0] > values[-1]:
        raise InputError(f"{flag} {text!r}: accepted: {accepted}")
    return LengthDist(min_tokens=values[0], max_tokens=values[-1])
