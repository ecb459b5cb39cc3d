"""The tune grid: batch shapes 'NxL' (N sequences of L tokens), from flags or from a prompt-length distribution."""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from pathlib import Path

from hybridserve.core.common.errors import InputError
from hybridserve.core.common.arith import cdiv

_SHAPE = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*$")


@dataclass(frozen=True, kw_only=True, order=True)
class BatchShape:
    num_seqs: int
    seq_len: int

    @property
    def label(self) -> str:
        return f"{self.num_seqs}x{self.seq_len}"

    @property
    def num_tokens(self) -> int:
        return self.num_seqs * self.seq_len


DEFAULT_SHAPES = (BatchShape(num_seqs=1, seq_len=1024), BatchShape(num_seqs=1, seq_len=8192),
                  BatchShape(num_seqs=1, seq_len=32768), BatchShape(num_seqs=4, seq_len=4096),
                  BatchShape(num_seqs=16, seq_len=2048))


# Without a GPU the default grid would take hours in the CPU backends: a small one stands in (tune says so).
CPU_DEFAULT_SHAPES = (BatchShape(num_seqs=1, seq_len=512), BatchShape(num_seqs=1, seq_len=2048),
                      BatchShape(num_seqs=4, seq_len=512))


def is_shape_text(text: str) -> bool:
    return bool(_SHAPE.match(text))


def parse_shape(text: str) -> BatchShape:
    m = _SHAPE.match(text)
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise InputError(f"--shapes {text!r}: not a batch shape; accepted: NxL with N sequences of L tokens, "
                         f"e.g. 1x8192 or 16x2048")
    return BatchShape(num_seqs=int(m.group(1)), seq_len=int(m.group(2)))


def shapes_from_lengths(path: Path, *, max_batch_tokens: int = 32768) -> list[BatchShape]:
    """A prompt-length distribution (one length per line) -> single sequences at p50/p90/p99 and a batch of p50
    prompts filling max_batch_tokens, lengths rounded up to 256."""
    try:
        lengths = [int(x) for x in path.read_text().split() if x.strip()]
    except (OSError, ValueError) as exc:
        raise InputError(f"--prompt-lengths {path}: unreadable ({exc}); accepted: a text file of integers") from None
    if not lengths or min(lengths) < 1:
        raise InputError(f"--prompt-lengths {path}: needs positive integers, one per line")
    cuts = statistics.quantiles(lengths, n=100, method="inclusive") if len(lengths) > 1 else [lengths[0]] * 99

    def up(n: float) -> int:
        return max(256, cdiv(int(n), 256) * 256)

    singles = {up(cuts[49]), up(cuts[89]), up(cuts[98])}
    p50 = up(cuts[49])
    shapes = {BatchShape(num_seqs=1, seq_len=n) for n in singles}
    shapes.add(BatchShape(num_seqs=max(1, max_batch_tokens // p50), seq_len=p50))
    return sorted(shapes)
