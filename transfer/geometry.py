"""Who holds what: head and conv-row ranges per rank, which prefill ranks a decode rank reads, block pairs.

Mirrors vLLM's TP split: attention KV heads are split over ranks (replicated when TP > heads: rank r then holds
head r // (TP / heads)); GDN conv rows are split per sub-projection (each rank holds its share of Q, of K and of
V rows, stored [Q | K | V]) and SSM value heads are split evenly. A decode rank reads from the prefill ranks
vLLM's `handshake_target_ranks` names: D >= P: rank d // (D/P); P > D: ranks d*(P/D) .. d*(P/D) + P/D - 1.
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridserve.core.layout.descriptors import moved_tokens
from hybridserve.core.layout.rank_layout import RankLayout
from hybridserve.core.common.arith import cdiv


@dataclass(frozen=True, kw_only=True)
class Side:
    """One rank's registered memory: T shared tensors of num_blocks * page bytes each."""

    layout: RankLayout
    rank: int
    bases: tuple[int, ...]
    num_blocks: int
    device: int = 0

    @property
    def tp(self) -> int:
        return self.layout.request.tp

    @property
    def region_bytes(self) -> int:
        return self.num_blocks * self.layout.page_size_bytes


@dataclass(frozen=True, kw_only=True)
class Span:
    """An overlap of two ranks' shares, in units (heads or rows), as offsets into each side's share."""

    remote_start: int
    local_start: int
    length: int


def kv_heads(layout: RankLayout, rank: int) -> tuple[int, int]:
    """(first global KV head, number of heads) held by `rank`."""
    total, tp = layout.request.model.num_kv_heads, layout.request.tp
    if tp <= total:
        per = total // tp
        return rank * per, per
    return rank // (tp // total), 1


def overlap(remote: tuple[int, int], local: tuple[int, int]) -> Span | None:
    start = max(remote[0], local[0])
    end = min(remote[0] + remote[1], local[0] + local[1])
    if end <= start:
        return None
    return Span(remote_start=start - remote[0], local_start=start - local[0], length=end - start)


def share(total: int, tp: int, rank: int) -> tuple[int, int]:
    """An even split of `total` units: (first unit, count) of `rank`."""
    per = total // tp
    return rank * per, per


def read_ranks(prefill_tp: int, decode_tp: int, decode_rank: int) -> tuple[int, ...]:
    if decode_tp >= prefill_tp:
        return (decode_rank // (decode_tp // prefill_tp),)
    ratio = prefill_tp // decode_tp
    return tuple(decode_rank * ratio + i for i in range(ratio))


@dataclass(frozen=True, kw_only=True)
class RequestBlocks:
    """One request's block ids per group, on the prefill side and the decode side (same order)."""

    prompt_tokens: int
    prefill: tuple[tuple[int, ...], ...]  # per group of the layout's GroupLayout
    decode: tuple[tuple[int, ...], ...]

    def pairs(self, group: int) -> list[tuple[int, int]]:
        return list(zip(self.prefill[group], self.decode[group], strict=True))


def runs(pairs: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """Split block pairs into runs that are consecutive on both sides (one byte range each side)."""
    out: list[list[tuple[int, int]]] = []
    for p, d in pairs:
        if out and out[-1][-1] == (p - 1, d - 1):
            out[-1].append((p, d))
        else:
            out.append([(p, d)])
    return out


def kernel_blocks_moved(layout: RankLayout, prompt_tokens: int, num_blocks: int, *, whole_blocks: bool) -> list[int]:
    """Kernel blocks moved per logical block of the attention group.

    vLLM moves every kernel block of each logical block; ours stops after the last kernel block holding a token.
    """
    ppl = layout.kernel_blocks_per_block
    if whole_blocks:
        return [ppl] * num_blocks
    tokens = moved_tokens(layout, prompt_tokens)
    last = tokens - (num_blocks - 1) * layout.block_size
    return [ppl] * (num_blocks - 1) + [cdiv(last, layout.kernel_block_size)] if num_blocks else []
