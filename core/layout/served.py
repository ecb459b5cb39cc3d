"""The block ids a fresh vLLM server hands requests it serves one at a time, and the runs NIXL then merges.

vLLM's block pool (v1/core/block_pool.py, kv_cache_utils.FreeKVCacheBlockQueue; 0.26 and 0.32 alike):
- a fresh pool queues ids 1, 2, ... in order (0 is the null block); `get_new_blocks` pops from the head;
- `allocate_slots` asks each KV cache group's manager in group order (KVCacheCoordinator): GDN groups first on
  Qwen3.5 (layer 0 is GDN), one state block each with mamba_cache_mode "none" (its block size is max_model_len,
  so chunked prefill adds only attention blocks, and nothing else allocates in between on an idle server);
- `free` goes group by group (KVCacheCoordinator.free), each manager handing its blocks *reversed*;
  `BlockPool.free_blocks` puts blocks without a hash (prefix caching off, as launch runs) at the *head*
  ("LIFO reuse of non-cached blocks"). So the next request gets the last one's attention blocks in descending
  order, then its GDN blocks, then fresh ids: descending ids never merge (merge.py).
The prefill side holds cdiv(N - 1, B) attention blocks (it computes N - 1 tokens, vLLM PR #37310); the decode side
cdiv(N - 1 + output, B) by the time the request finishes. Sliding-window groups are taken as holding the blocks
they keep (an approximation: vLLM frees the skipped ones during prefill).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from hybridserve.core.layout.descriptors import blocks_kept, moved_tokens
from hybridserve.core.layout.merge import num_runs
from hybridserve.core.layout.rank_layout import RankLayout


@dataclass(frozen=True, kw_only=True)
class ServedScenario:
    """How a fresh server was driven: a warm-up request of the first length, then `repeats` requests of each
    length in the order given, one at a time (the H200 measurement of 2026-12-02 reproduces with the defaults)."""

    num_warmup: int = 1
    repeats: int = 3
    output_tokens: int = 16


class FreeBlockQueue:
    """vLLM's free block queue as ids: recycled blocks at the head, then ids never handed out yet."""

    def __init__(self) -> None:
        self._head: deque[int] = deque()
        self._next_fresh = 1

    def take(self, count: int) -> list[int]:
        recycled = [self._head.popleft() for _ in range(min(count, len(self._head)))]
        fresh = count - len(recycled)
        self._next_fresh += fresh
        return recycled + list(range(self._next_fresh - fresh, self._next_fresh))

    def free(self, groups: list[list[int]]) -> None:
        """Group by group, each group's blocks reversed, put before the head (the last freed comes out first)."""
        for blocks in groups:
            self._head.extendleft(blocks)  # extendleft reverses: the group's last block becomes the head


def _group_counts(layout: RankLayout, tokens: int) -> list[int]:
    states = 1 + layout.request.num_speculative_tokens
    return [blocks_kept(layout, g, tokens) if g.kind.is_attention else states for g in layout.groups.groups]


def attention_runs(layout: RankLayout, prefill_ids: list[list[int]], decode_ids: list[list[int]]) -> int:
    """Runs of the attention groups' ids. With GDN layers vLLM lists each group on its own (_compute_desc_ids'
    per-group path); without, it concatenates every group's ids into one list per region."""
    groups = [i for i, g in enumerate(layout.groups.groups) if g.kind.is_attention]
    if layout.gdn is not None:
        return sum(num_runs(prefill_ids[i], decode_ids[i]) for i in groups)
    return num_runs([b for i in groups for b in prefill_ids[i]], [b for i in groups for b in decode_ids[i]])


def request_sequence(prompt_tokens: tuple[int, ...], scenario: ServedScenario) -> list[int]:
    return [prompt_tokens[0]] * scenario.num_warmup + [n for n in prompt_tokens for _ in range(scenario.repeats)]


def served_runs(prefill: RankLayout, decode: RankLayout, sequence: list[int], *, output_tokens: int) -> list[int]:
    """Attention runs of each request of `sequence` on a fresh prefill and a fresh decode server."""
    return runs_of_requests(prefill, decode, [(prompt, output_tokens) for prompt in sequence])


def mean_served_runs(prefill: RankLayout, decode: RankLayout, prompt_tokens: tuple[int, ...],
                     scenario: ServedScenario) -> dict[int, float]:
    """Per prompt length: the mean attention runs of its measured requests (warm-up left out)."""
    sequence = request_sequence(prompt_tokens, scenario)
    runs = served_runs(prefill, decode, sequence, output_tokens=scenario.output_tokens)[scenario.num_warmup:]
    measured = sequence[scenario.num_warmup:]
    return {n: sum(r for r, m in zip(runs, measured, strict=True) if m == n) / measured.count(n)
            for n in dict.fromkeys(prompt_tokens)}


def runs_of_requests(prefill: RankLayout, decode: RankLayout, requests: Sequence[tuple[int, int]], *,
                     decode_of: Sequence[int] | None = None) -> list[int]:
    """Attention runs of each (prompt tokens, output tokens) request, sent one at a time in this order to a fresh
    prefill and a fresh decode server, each with its own output length (decode's attention grows by it before the
    request frees its blocks, so it moves where the next request's ids start). `decode_of` names, per request,
    which of several fresh decode servers (0, 1, ...) read it from the one prefill: each decode has its own block
    pool, the prefill's is shared (a prefill in front of two decodes hands both its recycled ids)."""
    prefill_pool: FreeBlockQueue = FreeBlockQueue()
    decode_pools: dict[int, FreeBlockQueue] = {}
    out = []
    for i, (prompt, output) in enumerate(requests):
        pool = decode_pools.setdefault(decode_of[i] if decode_of is not None else 0, FreeBlockQueue())
        tokens = moved_tokens(decode, prompt)
        p_ids = [prefill_pool.take(n) for n in _group_counts(prefill, tokens)]
        d_ids = [pool.take(n) for n in _group_counts(decode, tokens)]
        out.append(attention_runs(decode, p_ids, d_ids))
        for g_index, g in enumerate(decode.groups.groups):  # decode's attention grows with the output tokens
            if g.kind.is_attention:
                d_ids[g_index] += pool.take(max(0, blocks_kept(decode, g, tokens + output) - len(d_ids[g_index])))
        prefill_pool.free(p_ids)
        pool.free(d_ids)
    return out
