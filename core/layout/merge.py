"""NIXL's merge of a transfer's descriptors, on the block ids vLLM hands it (no torch, no nixl).

What NIXL does (ai-dynamo/nixl, PR #1756 "Stride (compressed) descriptors for prep+make", in 1.3.1 and 1.4+; the
H200 ran 1.5.1):
- `prep_xfer_dlist` (`nixlMemSection::populate`) cuts a prepared list into runs: neighbouring entries of equal
  length, device and registered region whose addresses grow by one constant stride.
- `make_prepped_xfer` (`nixlAgent::makeXferReq`) walks the requested indices and, inside one run that is dense
  (stride == length) with the same stride on the remote side, folds indices that go up by one on *both* sides into
  one descriptor. `skip_desc_merge` turns that off; vLLM never sets it. The telemetry `descCount` (vLLM's
  `vllm:nixl_num_descriptors`) counts what is left.
What vLLM hands it (NixlConnector, `_build_fa_local/_remote`, `_build_mamba_local/_remote`, `_compute_desc_ids`,
the same in 0.26 and 0.32): one region per shared tensor; an attention descriptor per kernel block holding K and V
(stride = the kernel page: dense, one run per region); GDN: Q, K, V conv rows and the SSM state of a state block as
four descriptors of one region each (stride = the page, length smaller: never dense, never merged).
So per region the attention part costs one descriptor per *run* of a request's logical blocks, a run being blocks
whose ids go up by one on the prefill side and on the decode side alike (kernel ids b*r .. b*r + r - 1 of
consecutive logical blocks b continue each other), and the GDN part what it hands over.
"""

from __future__ import annotations

from collections.abc import Sequence


def num_runs(remote: Sequence[int], local: Sequence[int]) -> int:
    """Runs of block-id pairs that are consecutive on both sides: what one dense region costs after the merge.

    (remote, local) = ([4, 5, 6, 9], [4, 5, 6, 7]) -> 2; descending ids ([7, 6, 5]) never merge -> 3."""
    if len(remote) != len(local):
        raise ValueError(f"{len(remote)} remote block ids against {len(local)} local ones")
    runs = 0
    for i, (r, d) in enumerate(zip(remote, local, strict=True)):
        if i == 0 or r != remote[i - 1] + 1 or d != local[i - 1] + 1:
            runs += 1
    return runs


def merged_attention(*, num_regions: int, num_reads: int, runs: float, is_dense: bool, unmerged: int) -> float:
    """Attention descriptors after NIXL's merge. Only a homogeneous read is dense (whole kernel pages on both
    sides); head slices (heterogeneous TP) have length < stride and stay as handed over."""
    if not is_dense or unmerged == 0:
        return float(unmerged)
    return float(num_reads * num_regions * runs)
