"""vLLM's descriptor scheme (NixlConnector with the hybrid allocator), for one request and one decode rank.

Attention: under homogeneous TP one descriptor per shared tensor per *kernel* block holding K and V (vLLM 0.26 and
0.32 `_build_fa_local`: one region per tensor, length and stride the kernel page), whole logical blocks; under
heterogeneous TP two (the K and V head slices; the halves of a kernel block are [heads, kernel_block, head_dim],
HND, so a head slice is one range). GDN: four descriptors
per tensor per state block (Q, K, V conv rows and the SSM state, vLLM `_build_mamba_local` /
`derive_mamba_conv_split`); padding never moves. One READ per prefill rank read from; when P > D each READ fills
its 1/(P/D) chunk of the local K and V halves (vLLM splits the local regions by the TP ratio).
Order as vLLM's descriptor ids (`_compute_desc_ids`' per-group path): group by group in the layout's order (GDN
groups first on Qwen3.5); an attention group region-major (tensor, [K/V,] block, kernel block), a GDN group
(tensor, sub, block).
"""

from __future__ import annotations

import numpy as np

from hybridserve.core.layout.descriptors import VLLM_DESCRIPTORS_PER_GDN_STATE
from hybridserve.core.layout.rank_layout import RankLayout
from hybridserve.core.model.spec import LayerKind
from hybridserve.transfer.dlist import ReadDescriptors, RowBuilder
from hybridserve.transfer.geometry import RequestBlocks, Side, kv_heads, overlap, read_ranks, share


def build(local: Side, remotes: dict[int, Side], blocks: RequestBlocks) -> list[ReadDescriptors]:
    if next(iter(remotes.values())).tp == local.tp:
        return [prepared_read(local, remotes[local.rank], blocks)]
    reads = []
    for p in read_ranks(next(iter(remotes.values())).tp, local.tp, local.rank):
        rows = RowBuilder(local_device=local.device, remote_device=remotes[p].device)
        for g, group in enumerate(local.layout.groups.groups):
            if group.kind.is_attention:
                _attention(rows, local, remotes[p], blocks.pairs(g), len(group.layers))
            elif group.kind is LayerKind.LINEAR_ATTENTION:
                _gdn(rows, local, remotes[p], blocks.pairs(g), len(group.layers))
        reads.append(rows.build(p))
    return reads


def _head_slice(local: Side, remote: Side) -> tuple[int, int, int]:
    """(remote offset, local offset, length) in bytes inside a K (or V) half of a kernel block."""
    lay = local.layout
    head_bytes = lay.kernel_block_size * lay.attention.head_size * lay.dtypes.kv.num_bytes
    if remote.tp > local.tp:  # P > D: local halves split into P/D chunks, chunk i from the i-th prefill rank
        ratio = remote.tp // local.tp
        i = remote.rank - local.rank * ratio
        chunk = lay.attention.num_kv_heads * head_bytes // ratio
        remote_half = remote.layout.attention.num_kv_heads * head_bytes
        return (i * chunk) % remote_half, i * chunk, chunk
    span = overlap(kv_heads(remote.layout, remote.rank), kv_heads(lay, local.rank))
    return span.remote_start * head_bytes, span.local_start * head_bytes, span.length * head_bytes


def _attention(rows: RowBuilder, local: Side, remote: Side, pairs: list[tuple[int, int]], num_tensors: int) -> None:
    lk, rk = local.layout.kernel_page_size_bytes, remote.layout.kernel_page_size_bytes
    lp, rp = local.layout.page_size_bytes, remote.layout.page_size_bytes
    ppl = local.layout.kernel_blocks_per_block
    if local.tp == remote.tp:  # whole kernel pages [K | V]: dense, so NIXL merges a run of them
        for j in range(num_tensors):
            for pb, db in pairs:
                for k in range(ppl):
                    rows.add(local=local.bases[j] + db * lp + k * lk, remote=remote.bases[j] + pb * rp + k * rk,
                             length=lk, is_attention=True)
        return
    r_off, l_off, length = _head_slice(local, remote)
    for j in range(num_tensors):
        for kv in (0, 1):
            for pb, db in pairs:
                for k in range(ppl):
                    rows.add(local=local.bases[j] + db * lp + k * lk + kv * lk // 2 + l_off,
                             remote=remote.bases[j] + pb * rp + k * rk + kv * rk // 2 + r_off,
                             length=length, is_attention=True)


def gdn_pieces(local: Side, remote: Side) -> list[tuple[int, int, int]]:
    """(remote offset, local offset, length) in a state page for Q, K, V conv rows and the SSM heads."""
    pieces = []
    lg, rg = local.layout.gdn, remote.layout.gdn
    row = lg.conv_row_bytes
    head = lg.value_head_dim * lg.key_head_dim * lg.ssm_dtype.num_bytes
    units = ((0, 0, lg.key_dim * local.tp, row),  # Q rows
             (rg.key_dim * row, lg.key_dim * row, lg.key_dim * local.tp, row),  # K rows
             (2 * rg.key_dim * row, 2 * lg.key_dim * row, lg.value_dim * local.tp, row),  # V rows
             (rg.ssm_offset_bytes, lg.ssm_offset_bytes, lg.num_value_heads * local.tp, head))  # SSM heads
    for r_base, l_base, total, unit in units:
        span = overlap(share(total, remote.tp, remote.rank), share(total, local.tp, local.rank))
        pieces.append((r_base + span.remote_start * unit, l_base + span.local_start * unit, span.length * unit))
    return pieces


def _gdn(rows: RowBuilder, local: Side, remote: Side, pairs: list[tuple[int, int]], num_tensors: int) -> None:
    pieces = gdn_pieces(local, remote)
    for j in range(num_tensors):
        for r_off, l_off, length in pieces:
            for pb, db in pairs:
                rows.add(local=local.bases[j] + db * local.layout.page_size_bytes + l_off,
                         remote=remote.bases[j] + pb * remote.layout.page_size_bytes + r_off,
                         length=length, is_attention=False)


def registered_list(side: Side, pieces: list[tuple[int, int]]) -> np.ndarray:
    """The Nx3 list vLLM prepares once for a side (`_build_fa_local` + `_build_mamba_local`): per region (tensor)
    every kernel block of every block [K | V]; then, when the model has GDN layers, per region and piece (Q, K, V
    conv rows, SSM: (offset, length) in `pieces`) every block."""
    lay = side.layout
    kernel, page = lay.kernel_page_size_bytes, lay.page_size_bytes
    num_kernel = side.num_blocks * lay.kernel_blocks_per_block
    bases = side.bases[:lay.num_tensors]
    parts = [_rows(base + np.arange(num_kernel, dtype=np.uint64) * kernel, kernel, side.device) for base in bases]
    if lay.gdn is not None:
        blocks = np.arange(side.num_blocks, dtype=np.uint64) * page
        parts += [_rows(base + blocks + off, length, side.device) for base in bases for off, length in pieces]
    return np.concatenate(parts)


def desc_ids(layout: RankLayout, num_blocks: int, ids: tuple[tuple[int, ...], ...]) -> tuple[np.ndarray, int]:
    """vLLM `_compute_desc_ids` for one side: (descriptor ids into registered_list, how many are attention).

    Attention ids are region * (blocks * r) + kernel id (each block b as kernel ids b*r .. b*r + r - 1,
    `_logical_to_kernel_block_ids`); GDN ids follow all attention ids: (region * 4 + piece) * blocks + b. With GDN
    layers the groups come in the layout's order, one after another; without, every group's ids at once."""
    r, t = layout.kernel_blocks_per_block, layout.num_tensors
    num_kernel = num_blocks * r

    def kernel_ids(group_ids: tuple[int, ...]) -> np.ndarray:
        return (np.asarray(group_ids, dtype=np.int64)[:, None] * r + np.arange(r)).ravel()

    groups = layout.groups.groups
    if layout.gdn is None:
        ids_all = kernel_ids(tuple(b for g in range(len(groups)) for b in ids[g]))
        out = (np.arange(t)[:, None] * num_kernel + ids_all[None, :]).ravel()
        return out.astype(np.int32), len(out)
    parts, num_attention = [], 0
    for g, group in enumerate(groups):
        block_ids = np.asarray(ids[g], dtype=np.int64)
        if group.kind.is_attention:
            part = (np.arange(t)[:, None] * num_kernel + kernel_ids(ids[g])[None, :]).ravel()
            num_attention += len(part)
        else:
            regions = np.arange(t * VLLM_DESCRIPTORS_PER_GDN_STATE)[:, None]
            part = (t * num_kernel + regions * num_blocks + block_ids[None, :]).ravel()
        parts.append(part)
    return np.concatenate(parts).astype(np.int32), num_attention


def prepared_read(local: Side, remote: Side, blocks: RequestBlocks) -> ReadDescriptors:
    """Homogeneous TP, as vLLM posts it: both sides' whole lists prepared, the request's descriptor ids posted."""
    pieces = gdn_pieces(local, remote) if local.layout.gdn is not None else []
    local_list = registered_list(local, [(l_off, n) for _, l_off, n in pieces])
    remote_list = registered_list(remote, [(r_off, n) for r_off, _, n in pieces])
    local_ids, num_attention = desc_ids(local.layout, local.num_blocks, blocks.decode)
    remote_ids, _ = desc_ids(remote.layout, remote.num_blocks, blocks.prefill)

    def chosen(rows: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """The rows the ids name. An id past the prepared list (a block id the side never registered) keeps its
        index, which NIXL's make_prepped_xfer refuses, and gets address 0, which no registered region holds, so
        the range check names it too."""
        out = np.ones((len(ids), 5), dtype=np.uint64)
        outside = ids >= len(rows)
        out[:, :3] = rows[np.where(outside, 0, ids)]
        out[outside, 0] = 0
        out[:, 3] = out[:, 1]
        return out

    return ReadDescriptors(remote_rank=remote.rank, local=chosen(local_list, local_ids),
                           remote=chosen(remote_list, remote_ids), num_attention=num_attention,
                           num_gdn=len(local_ids) - num_attention, prepared=(local_list, remote_list),
                           local_index=local_ids, remote_index=remote_ids)


def _rows(addrs: np.ndarray, length: int, device: int) -> np.ndarray:
    out = np.empty((len(addrs), 3), dtype=np.uint64)
    out[:, 0], out[:, 1], out[:, 2] = addrs, length, device
    return out
