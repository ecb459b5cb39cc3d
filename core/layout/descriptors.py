"""NIXL descriptors and bytes one request's transfer needs, per decode rank: vLLM's scheme and ours.

vLLM (NixlConnector with the hybrid allocator, READ by the decode side, one READ per remote rank; 0.26 and 0.32):
  attention: one descriptor per shared tensor per *kernel* block, K and V together (both versions register one
  region per tensor whose kernel blocks hold [K | V]: `_build_fa_local`, "K and V are packed into the content dim");
  heterogeneous TP is modelled as K and V head slices, two per kernel block (not checked against vLLM);
  GDN: Q, K, V conv slices and the SSM state are four descriptors per tensor per state block.
  Qwen3.5: N = T * cdiv(N_tok - 1, B) * (B / B_kernel) + 12T * (1 + num_spec): the descriptor ids vLLM hands NIXL.
NIXL's make_prepped_xfer then merges runs (merge.py): what vLLM posts and counts is one attention descriptor per
tensor per run of block ids consecutive on both sides, plus the GDN pieces; how the runs fall on a fresh server is
served.py. The H200 (60 layers, 397B TP1 geometry, fp32 SSM, 32k): 31,620 ids, 280 posted, at most 420.
Ours: a run of physically contiguous blocks of one tensor is one byte range whatever the kernel block; a GDN
layer's conv and SSM state are contiguous inside its page, so one descriptor covers both (padding never moves).
Head slices under heterogeneous TP are equally spaced: one strided descriptor (address, length, stride, count)
covers a run; a sliced GDN state needs three (Q and K rows share one strided descriptor, V rows, SSM heads).
NIXL 1.5.1 takes strided rows (an Nx5 list in prep_xfer_dlist) but expands each into one element per slice when
it prepares the list, so `nixl_elements` counts what a transfer then carries: equal to the descriptors except
for sliced heads under heterogeneous TP (2 per kernel block per tensor for attention, 4 per GDN state).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from hybridserve.core.layout.groups import KVCacheGroup
from hybridserve.core.layout.merge import merged_attention
from hybridserve.core.layout.rank_layout import RankLayout
from hybridserve.core.model.spec import LayerKind
from hybridserve.core.common.arith import cdiv

VLLM_DESCRIPTORS_PER_GDN_STATE = 4  # Q, K, V conv sub-projections + SSM (vLLM _build_mamba_local)


class Scheme(enum.Enum):
    VLLM = "vllm"
    OURS = "ours"


@dataclass(frozen=True, kw_only=True)
class TransferCost:
    scheme: Scheme
    prompt_tokens: int
    moved_tokens: int
    num_reads: int  # READs per decode rank (one per remote rank read from)
    attention_descriptors: int
    gdn_descriptors: int
    attention_bytes: int
    gdn_bytes: int
    nixl_elements: int  # after NIXL expands strided descriptors
    # vLLM's scheme after NIXL's merge (merge.py); ours: served = nixl_elements, fragmented a run per block.
    served_descriptors: float  # what vllm:nixl_num_descriptors reports: `served_runs` runs (default 1: a fresh
    #                            server's first request); a mean when the runs come from served.py's scenario
    contiguous_descriptors: int  # every attention group in one run (a fresh server's first request)
    unmerged_descriptors: int  # the descriptor ids handed to make_prepped_xfer (= total_descriptors)
    fragmented_descriptors: int  # a run per block: what a long-lived server's scattered free queue can cost

    @property
    def total_descriptors(self) -> int:
        return self.attention_descriptors + self.gdn_descriptors

    @property
    def total_bytes(self) -> int:
        return self.attention_bytes + self.gdn_bytes


def moved_tokens(layout: RankLayout, prompt_tokens: int) -> int:
    """vLLM PR #37310: with GDN layers the prefill side stops one token short and the decode side recomputes the
    last prompt token (a recurrent state cannot be rewound), so N - 1 tokens move."""
    return max(0, prompt_tokens - 1) if layout.gdn is not None else prompt_tokens


def blocks_kept(layout: RankLayout, group: KVCacheGroup, num_tokens: int) -> int:
    """Logical blocks a group holds for a prompt; a sliding-window group keeps cdiv(window, B) + 1."""
    num_blocks = cdiv(num_tokens, layout.block_size)
    if group.kind is LayerKind.SLIDING_ATTENTION and layout.attention.sliding_window is not None:
        return min(num_blocks, cdiv(layout.attention.sliding_window, layout.block_size) + 1)
    return num_blocks


def transfer_cost(prefill: RankLayout, decode: RankLayout, prompt_tokens: int, scheme: Scheme,
                  *, num_runs: int = 1, served_runs: float | None = None) -> TransferCost:
    """One request, per decode rank. `num_runs`: contiguous runs the blocks of a group come in (ours only);
    `served_runs`: attention runs after NIXL's merge (vLLM only; None: one per attention group)."""
    tokens = moved_tokens(decode, prompt_tokens)
    geometry = _TpGeometry(prefill, decode)
    groups = decode.groups
    t = groups.num_tensors
    attn_descs = attn_bytes = gdn_descs = gdn_bytes = elements = num_blocks = 0
    for group in groups.groups:
        if group.kind.is_attention:
            kept = blocks_kept(decode, group, tokens)
            num_blocks += kept
            if scheme is Scheme.VLLM:
                per_kernel_block = 1 if geometry.is_homogeneous else 2
                attn_descs += geometry.num_reads * per_kernel_block * t * kept * decode.kernel_blocks_per_block
                attn_bytes += t * kept * decode.page_size_bytes
            else:
                kernel_blocks = _kernel_blocks_holding(decode, group, tokens, kept)
                descs = geometry.num_attention_reads * t * min(max(1, num_runs), kept)
                attn_descs += descs
                attn_bytes += t * kernel_blocks * decode.kernel_page_size_bytes
                elements += geometry.num_attention_reads * t * 2 * kernel_blocks if geometry.is_head_sliced else descs
        else:
            states = 1 + decode.request.num_speculative_tokens
            per_state = VLLM_DESCRIPTORS_PER_GDN_STATE if scheme is Scheme.VLLM else geometry.ours_per_gdn_state
            gdn_descs += geometry.num_reads * t * states * per_state
            elements += geometry.num_reads * t * states * (per_state if per_state != 3 else 4)
            gdn_bytes += t * states * decode.gdn.real_page_size_bytes
    merged = _merged_counts(decode, geometry, scheme, attn_descs, gdn_descs, num_blocks, served_runs,
                            attn_descs + gdn_descs if scheme is Scheme.VLLM else elements)
    return TransferCost(scheme=scheme, prompt_tokens=prompt_tokens, moved_tokens=tokens,
                        num_reads=geometry.num_reads, attention_descriptors=attn_descs, gdn_descriptors=gdn_descs,
                        attention_bytes=attn_bytes, gdn_bytes=gdn_bytes,
                        nixl_elements=attn_descs + gdn_descs if scheme is Scheme.VLLM else elements, **merged)


def _merged_counts(decode: RankLayout, geometry: _TpGeometry, scheme: Scheme, attn: int, gdn: int,
                   num_blocks: int, served_runs: float | None, elements: int) -> dict[str, float | int]:
    t = decode.num_tensors
    if scheme is Scheme.OURS:  # one range per run already; NIXL posts each element of a strided row on its own
        fragmented = geometry.num_attention_reads * t * num_blocks if attn else 0
        return dict(served_descriptors=float(elements), contiguous_descriptors=elements,
                    unmerged_descriptors=attn + gdn, fragmented_descriptors=fragmented + gdn)
    groups = sum(1 for g in decode.groups.groups if g.kind.is_attention) if decode.gdn is not None else 1

    def after_merge(runs: float) -> float:
        return merged_attention(num_regions=t, num_reads=geometry.num_reads, runs=runs,
                                is_dense=geometry.is_homogeneous, unmerged=attn) + gdn

    contiguous = after_merge(min(groups, num_blocks))
    return dict(served_descriptors=contiguous if served_runs is None else after_merge(served_runs),
                contiguous_descriptors=int(contiguous), unmerged_descriptors=attn + gdn,
                fragmented_descriptors=int(after_merge(num_blocks)))


def _kernel_blocks_holding(layout: RankLayout, group: KVCacheGroup, tokens: int, kept: int) -> int:
    """Ours moves only the kernel blocks that hold tokens (the tail of the last logical block stays)."""
    if group.kind is LayerKind.FULL_ATTENTION:
        return cdiv(tokens, layout.kernel_block_size)
    return kept * layout.kernel_blocks_per_block


class _TpGeometry:
    """Which prefill ranks one decode rank reads from (vLLM tp_ratio), and whether it reads head slices."""

    def __init__(self, prefill: RankLayout, decode: RankLayout) -> None:
        p_tp, d_tp = prefill.request.tp, decode.request.tp
        self.num_reads = p_tp // d_tp if p_tp > d_tp else 1
        p_heads, d_heads = prefill.attention.num_kv_heads, decode.attention.num_kv_heads
        # P > D: one READ per prefill rank; replicated KV heads are read once, from the rank that holds them.
        self.num_attention_reads = max(1, min(self.num_reads, d_heads // p_heads))
        self.ours_per_gdn_state = 1 if p_tp == d_tp else 3
        # whole kernel pages on both sides: vLLM's attention descriptors are dense, so NIXL merges their runs
        self.is_homogeneous = p_tp == d_tp
        # a side whose kernel block holds more heads than the other reads or writes equally spaced slices
        self.is_head_sliced = p_heads != d_heads
