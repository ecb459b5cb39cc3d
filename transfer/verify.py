"""Check a finished request on a decode rank: every moved byte right, and nothing else in its regions changed.

The expectation is built from what the bytes *mean*, independently of the descriptor arithmetic: prefill ranks'
pages are recomputed from their pattern seeds, viewed as vLLM views them (kernel blocks [K|V][heads][...],
conv rows [Q|K|V], SSM heads), assembled into the model's global heads and rows, and this rank's share is cut
out of them (vLLM's TP split). Everything else must still hold this rank's own pattern.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hybridserve.core.layout.rank_layout import RankLayout
from hybridserve.core.model.spec import LayerKind
from hybridserve.transfer.geometry import RequestBlocks, kernel_blocks_moved, kv_heads
from hybridserve.transfer.regions import Regions, pattern


@dataclass(frozen=True, kw_only=True)
class CheckResult:
    checked_bytes: int
    moved_bytes: int
    mismatched_bytes: int
    first_mismatch: str | None  # "tensor j, byte offset o" or None

    @property
    def is_exact(self) -> bool:
        return self.mismatched_bytes == 0


def check_request(local: Regions, prefill: RankLayout, prefill_seeds: list[int], blocks: RequestBlocks,
                  *, whole_blocks: bool) -> CheckResult:
    import torch

    checked = moved = mismatched = 0
    first = None
    for j, actual in enumerate(local.tensors):
        expected = pattern(local.seed, j, 0, actual.numel(), actual.device)
        moved += _overlay(expected, j, local, prefill, prefill_seeds, blocks, whole_blocks)
        checked += actual.numel()
        if torch.equal(actual, expected):
            continue
        diff = actual != expected
        mismatched += int(diff.sum())
        if first is None:
            first = f"tensor {j}, byte offset {int(torch.nonzero(diff)[0])}"
    return CheckResult(checked_bytes=checked, moved_bytes=moved, mismatched_bytes=mismatched, first_mismatch=first)


def _overlay(expected: Any, j: int, local: Regions, prefill: RankLayout, seeds: list[int],
             blocks: RequestBlocks, whole_blocks: bool) -> int:
    """Write into `expected` what the request should have brought into tensor j; returns the bytes."""
    moved = 0
    for g, group in enumerate(local.layout.groups.groups):
        if j >= len(group.layers):
            continue
        pairs = blocks.pairs(g)
        if group.kind.is_attention:
            counts = kernel_blocks_moved(local.layout, blocks.prompt_tokens, len(pairs), whole_blocks=whole_blocks)
            for (pb, db), nk in zip(pairs, counts, strict=True):
                moved += _attention_block(expected, j, local, prefill, seeds, pb, db, nk)
        elif group.kind is LayerKind.LINEAR_ATTENTION:
            for pb, db in pairs:
                moved += _gdn_state(expected, j, local, prefill, seeds, pb, db)
    return moved


def _attention_block(expected: Any, j: int, local: Regions, prefill: RankLayout, seeds: list[int],
                     pb: int, db: int, nk: int) -> int:
    import torch

    lay = local.layout
    per_head = lay.kernel_block_size * lay.attention.head_size * lay.dtypes.kv.num_bytes
    total_heads = lay.request.model.num_kv_heads
    glob = torch.empty((nk, 2, total_heads, per_head), dtype=torch.uint8, device=expected.device)
    for p, seed in enumerate(seeds):
        first, n = kv_heads(prefill, p)
        page = pattern(seed, j, pb * prefill.page_size_bytes, nk * prefill.kernel_page_size_bytes, expected.device)
        glob[:, :, first:first + n] = page.view(nk, 2, n, per_head)
    first, n = kv_heads(lay, local.rank)
    start = db * lay.page_size_bytes
    size = nk * lay.kernel_page_size_bytes
    expected[start:start + size].view(nk, 2, n, per_head).copy_(glob[:, :, first:first + n])
    return size


def _gdn_state(expected: Any, j: int, local: Regions, prefill: RankLayout, seeds: list[int], pb: int,
               db: int) -> int:
    import torch

    parts: list[list[Any]] = [[], [], [], []]  # Q rows, K rows, V rows, SSM heads, in global order
    for p, seed in enumerate(seeds):
        g = prefill.gdn
        page = pattern(seed, j, pb * prefill.page_size_bytes, g.real_page_size_bytes, expected.device)
        conv = page[:g.conv_state_bytes].view(g.conv_dim, g.conv_row_bytes)
        parts[0].append(conv[:g.key_dim])
        parts[1].append(conv[g.key_dim:2 * g.key_dim])
        parts[2].append(conv[2 * g.key_dim:])
        parts[3].append(page[g.ssm_offset_bytes:].view(g.num_value_heads, -1))
    mine = local.layout.gdn
    r = local.rank
    rows = (mine.key_dim, mine.key_dim, mine.value_dim, mine.num_value_heads)
    pieces = [torch.cat(part)[r * n:(r + 1) * n].reshape(-1) for part, n in zip(parts, rows, strict=True)]
    start = db * local.layout.page_size_bytes
    state = torch.cat(pieces)
    expected[start:start + state.numel()].copy_(state)
    return state.numel()
