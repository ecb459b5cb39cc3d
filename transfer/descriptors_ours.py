"""Our descriptor scheme, for one request and one decode rank.

Attention: a run of blocks consecutive on both sides is one byte range per tensor, whatever the kernel block,
and it stops after the last kernel block holding a token. Under heterogeneous TP the head slices of a run are
equally spaced (K and V halves alternate every half kernel page), so one strided row covers the run. Replicated
KV heads (TP > KV heads) are read once, from the first prefill rank holding them.
GDN: conv and SSM state are contiguous in a page, so under homogeneous TP one descriptor covers a state (padding
never moves); under heterogeneous TP three rows: Q and K rows (equal length, one stride apart), V rows, SSM heads.
"""

from __future__ import annotations

from hybridserve.core.model.spec import LayerKind
from hybridserve.transfer.descriptors_vllm import gdn_pieces
from hybridserve.transfer.dlist import ReadDescriptors, RowBuilder
from hybridserve.transfer.geometry import RequestBlocks, Side, kernel_blocks_moved, kv_heads, overlap, read_ranks, runs


def build(local: Side, remotes: dict[int, Side], blocks: RequestBlocks) -> list[ReadDescriptors]:
    reads = []
    seen_heads: set[tuple[int, int]] = set()
    for p in read_ranks(next(iter(remotes.values())).tp, local.tp, local.rank):
        remote = remotes[p]
        rows = RowBuilder(local_device=local.device, remote_device=remote.device)
        heads = kv_heads(remote.layout, p)
        if heads not in seen_heads and overlap(heads, kv_heads(local.layout, local.rank)):
            seen_heads.add(heads)
            _attention(rows, local, remote, blocks)
        _gdn(rows, local, remote, blocks)
        reads.append(rows.build(p))
    return reads


def _attention(rows: RowBuilder, local: Side, remote: Side, blocks: RequestBlocks) -> None:
    lay = local.layout
    head_bytes = lay.kernel_block_size * lay.attention.head_size * lay.dtypes.kv.num_bytes
    span = overlap(kv_heads(remote.layout, remote.rank), kv_heads(lay, local.rank))
    lk, rk = lay.kernel_page_size_bytes, remote.layout.kernel_page_size_bytes
    for g, group in enumerate(lay.groups.groups):
        if not group.kind.is_attention:
            continue
        pairs = blocks.pairs(g)
        moved = dict(zip(pairs, kernel_blocks_moved(lay, blocks.prompt_tokens, len(pairs), whole_blocks=False)))
        for j in range(len(group.layers)):
            for run in runs(pairs):
                (pb, db), num_kernel = run[0], sum(moved[pair] for pair in run)
                rows.add(local=local.bases[j] + db * lay.page_size_bytes + span.local_start * head_bytes,
                         remote=remote.bases[j] + pb * remote.layout.page_size_bytes + span.remote_start * head_bytes,
                         length=span.length * head_bytes, count=2 * num_kernel,
                         local_stride=lk // 2, remote_stride=rk // 2, is_attention=True)


def _gdn(rows: RowBuilder, local: Side, remote: Side, blocks: RequestBlocks) -> None:
    lay = local.layout
    homogeneous = local.tp == remote.tp
    q, k, v, ssm = gdn_pieces(local, remote)
    for g, group in enumerate(lay.groups.groups):
        if group.kind is not LayerKind.LINEAR_ATTENTION:
            continue
        for j in range(len(group.layers)):
            for pb, db in blocks.pairs(g):
                lbase = local.bases[j] + db * lay.page_size_bytes
                rbase = remote.bases[j] + pb * remote.layout.page_size_bytes
                if homogeneous:
                    rows.add(local=lbase, remote=rbase, length=lay.gdn.real_page_size_bytes, is_attention=False)
                    continue
                rows.add(local=lbase + q[1], remote=rbase + q[0], length=q[2], count=2,
                         local_stride=k[1] - q[1], remote_stride=k[0] - q[0], is_attention=False)
                for r_off, l_off, length in (v, ssm):
                    rows.add(local=lbase + l_off, remote=rbase + r_off, length=length, is_attention=False)
