"""vLLM's descriptor scheme (NixlConnector with the hybrid allocator), for one request and one decode rank.

Attention: two descriptors (K, V) per shared tensor per *kernel* block, whole logical blocks; the K and V halves
of a kernel block are [heads, kernel_block, head_dim] (HND) so a head slice is one range. GDN: four descriptors
per tensor per state block (Q, K, V conv rows and the SSM state, vLLM `_build_mamba_local` /
`derive_mamba_conv_split`); padding never moves. One READ per prefill rank read from; when P > D each READ fills
its 1/(P/D) chunk of the local K and V halves (vLLM splits the local regions by the TP ratio).
Order as vLLM's descriptor ids: attention region-major (tensor, K/V, block), then GDN (group, tensor, sub, block).
"""

from __future__ import annotations

from hybridserve.core.model.spec import LayerKind
from hybridserve.transfer.dlist import ReadDescriptors, RowBuilder
from hybridserve.transfer.geometry import RequestBlocks, Side, kv_heads, overlap, read_ranks, share


def build(local: Side, remotes: dict[int, Side], blocks: RequestBlocks) -> list[ReadDescriptors]:
    reads = []
    for p in read_ranks(next(iter(remotes.values())).tp, local.tp, local.rank):
        rows = RowBuilder(local_device=local.device, remote_device=remotes[p].device)
        _attention(rows, local, remotes[p], blocks)
        _gdn(rows, local, remotes[p], blocks)
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


def _attention(rows: RowBuilder, local: Side, remote: Side, blocks: RequestBlocks) -> None:
    r_off, l_off, length = _head_slice(local, remote)
    lk, rk = local.layout.kernel_page_size_bytes, remote.layout.kernel_page_size_bytes
    ppl = local.layout.kernel_blocks_per_block
    for g, group in enumerate(local.layout.groups.groups):
        if not group.kind.is_attention:
            continue
        pairs = blocks.pairs(g)
        for j in range(len(group.layers)):
            for kv in (0, 1):
                for pb, db in pairs:
                    for k in range(ppl):
                        rows.add(local=local.bases[j] + db * local.layout.page_size_bytes + k * lk + kv * lk // 2
                                 + l_off,
                                 remote=remote.bases[j] + pb * remote.layout.page_size_bytes + k * rk
                                 + kv * rk // 2 + r_off,
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


def _gdn(rows: RowBuilder, local: Side, remote: Side, blocks: RequestBlocks) -> None:
    pieces = gdn_pieces(local, remote)
    for g, group in enumerate(local.layout.groups.groups):
        if group.kind is not LayerKind.LINEAR_ATTENTION:
            continue
        pairs = blocks.pairs(g)
        for j in range(len(group.layers)):
            for r_off, l_off, length in pieces:
                for pb, db in pairs:
                    rows.add(local=local.bases[j] + db * local.layout.page_size_bytes + l_off,
                             remote=remote.bases[j] + pb * remote.layout.page_size_bytes + r_off,
                             length=length, is_attention=False)
