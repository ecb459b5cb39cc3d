"""Block ids for requests: a pool per side, as vLLM's global block pool (block 0 is the null block).

A request takes, per group, the blocks its transfer touches: the attention group the logical blocks of the
moved tokens, each GDN group 1 + num_speculative_tokens state blocks (mamba_cache_mode none). Ids come
contiguous per group, fragmented (a random sample of the free ids in random order), or as a fresh vLLM server
hands them to requests served one after another (core/layout/served.py: pop from the head of the free queue; a
request's blocks go back group by group, each reversed, before the head: vLLM's LIFO reuse).
"""

from __future__ import annotations

import enum
import random

from hybridserve.core.layout.descriptors import blocks_kept, moved_tokens
from hybridserve.core.common.errors import InputError
from hybridserve.core.layout.rank_layout import RankLayout
from hybridserve.transfer.geometry import RequestBlocks


class Allocation(enum.Enum):
    CONTIGUOUS = "contiguous"
    FRAGMENTED = "fragmented"
    FRESH = "fresh"  # vLLM's free queue on a fresh server (first request contiguous, the next one descending...)


def blocks_per_group(layout: RankLayout, prompt_tokens: int) -> list[int]:
    tokens = moved_tokens(layout, prompt_tokens)
    states = 1 + layout.request.num_speculative_tokens
    return [blocks_kept(layout, g, tokens) if g.kind.is_attention else states for g in layout.groups.groups]


class BlockPool:
    def __init__(self, num_blocks: int, *, seed: int) -> None:
        self.num_blocks = num_blocks
        self._free = list(range(1, num_blocks))
        self._rng = random.Random(seed)
        self._is_lifo = False  # set by a FRESH take: blocks then go back as vLLM's BlockPool.free_blocks puts them

    def take(self, counts: list[int], allocation: Allocation) -> tuple[tuple[int, ...], ...]:
        need = sum(counts)
        if need > len(self._free):
            raise InputError(f"request needs {need} blocks, the pool has {len(self._free)} free of {self.num_blocks}")
        if allocation is Allocation.FRAGMENTED:
            chosen = self._rng.sample(self._free, need)
        elif allocation is Allocation.FRESH:
            self._is_lifo = True
            chosen = self._free[:need]
        else:
            chosen = self._first_run(need)
        taken = set(chosen)
        self._free = [b for b in self._free if b not in taken]
        out, at = [], 0
        for n in counts:
            out.append(tuple(chosen[at:at + n]))
            at += n
        return tuple(out)

    def _first_run(self, need: int) -> list[int]:
        free = sorted(self._free)
        for i in range(len(free) - need + 1):
            if free[i + need - 1] - free[i] == need - 1:
                return free[i:i + need]
        raise InputError(f"no {need} contiguous free blocks in a pool of {self.num_blocks}")

    def give_back(self, ids: tuple[tuple[int, ...], ...]) -> None:
        if not self._is_lifo:
            self._free.extend(b for group in ids for b in group)
            return
        head: list[int] = []
        for group in ids:  # KVCacheCoordinator.free: group by group, each reversed, prepended
            head = list(reversed(group)) + head
        self._free = head + self._free


def allocate(prefill: BlockPool, decode: BlockPool, layout: RankLayout, prompt_tokens: int,
             allocation: Allocation) -> RequestBlocks:
    counts = blocks_per_group(layout, prompt_tokens)
    return RequestBlocks(prompt_tokens=prompt_tokens, prefill=prefill.take(counts, allocation),
                         decode=decode.take(counts, allocation))
