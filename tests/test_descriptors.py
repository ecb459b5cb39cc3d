"""Descriptor counts: the ids vLLM hands NIXL (one per kernel block, K and V together), what NIXL merges them to,
and our scheme's."""

import pytest

from hybridserve.core.layout.attention_backend import AttentionBackend
from hybridserve.core.layout.descriptors import Scheme, transfer_cost
from hybridserve.core.model.dtypes import DType
from hybridserve.core.layout.rank_layout import LayoutRequest, plan_layout
from hybridserve.core.model.profiles import load_model
from hybridserve.core.common.arith import cdiv

FA, FI = AttentionBackend.FLASH_ATTN, AttentionBackend.FLASHINFER


def cost(model, scheme, tokens, *, p_tp=1, d_tp=1, runs=1, **kw):
    spec = load_model(model)
    p = plan_layout(LayoutRequest(model=spec, tp=p_tp, **kw))
    d = plan_layout(LayoutRequest(model=spec, tp=d_tp, **kw))
    return transfer_cost(p, d, tokens, scheme, num_runs=runs)


@pytest.mark.parametrize("backend, expected", [(FA, 15 * 8 * 1 + 12 * 15), (FI, 15 * 8 * 67 + 12 * 15)],
                         ids=["flash_attn-300", "flashinfer-8220"])
def test_vllm_397b_8k(backend, expected):
    c = cost("qwen3.5-397b-a17b", Scheme.VLLM, 8192, backend=backend, ssm_dtype=DType.BFLOAT16)
    assert c.total_descriptors == c.unmerged_descriptors == expected
    assert c.moved_tokens == 8191
    # NIXL merges the kernel blocks of one run into one descriptor per tensor; the 12 GDN pieces per tensor stay
    assert c.served_descriptors == c.contiguous_descriptors == 15 + 12 * 15
    assert c.fragmented_descriptors == 15 * 8 + 12 * 15


def test_ours_397b_flashinfer_8k_is_under_a_tenth_of_vllms_ids_not_of_what_vllm_posts():
    vllm = cost("qwen3.5-397b-a17b", Scheme.VLLM, 8192, backend=FI, ssm_dtype=DType.BFLOAT16)
    ours = cost("qwen3.5-397b-a17b", Scheme.OURS, 8192, backend=FI, ssm_dtype=DType.BFLOAT16)
    assert ours.total_descriptors == 15 * 1 + 3 * 15  # one run per tensor + one per GDN state
    assert ours.total_descriptors * 10 <= vllm.unmerged_descriptors == 8220
    assert vllm.served_descriptors == 195 < 4 * ours.total_descriptors  # after NIXL's merge: 3.25x, not 137x


def test_gemma_one_descriptor_per_block_and_tensor_with_and_without_hybrid_allocator():
    # the published 4,284 / 1,650 counted K and V apart (older NixlConnector); 0.26 and 0.32 register one
    # region per tensor with [K | V] in each block, so half of that
    tokens = 63 * 64  # a request spanning 63 blocks of 64 tokens; no N-1 rule without GDN layers
    no_hma = cost("gemma-3-4b-it", Scheme.VLLM, tokens, block_size=64, hybrid_allocator=False)
    hma = cost("gemma-3-4b-it", Scheme.VLLM, tokens, block_size=64)
    assert no_hma.total_descriptors == 34 * 63 == 4284 // 2
    assert hma.total_descriptors == 5 * (63 + 6 * (1024 // 64 + 1)) == 1650 // 2
    # without GDN layers vLLM lists every group's ids in one run per region: contiguous groups merge into one
    assert (no_hma.contiguous_descriptors, hma.contiguous_descriptors) == (34, 5)


def test_padding_never_moves_and_ours_trims_the_last_block():
    c_vllm = cost("qwen3.5-397b-a17b", Scheme.VLLM, 8192, backend=FI, ssm_dtype=DType.BFLOAT16)
    c_ours = cost("qwen3.5-397b-a17b", Scheme.OURS, 8192, backend=FI, ssm_dtype=DType.BFLOAT16)
    assert c_vllm.gdn_bytes == c_ours.gdn_bytes == 45 * (73_728 + 2_097_152)
    assert c_vllm.attention_bytes == 15 * 8 * 1072 * 2048
    assert c_ours.attention_bytes == 15 * cdiv(8191, 16) * 16 * 2048


def test_fragmentation_grows_ours_with_runs_not_tokens():
    counts = [cost("qwen3.5-397b-a17b", Scheme.OURS, 8192, backend=FI, runs=r, ssm_dtype=DType.BFLOAT16)
              .total_descriptors for r in (1, 4, 100)]
    assert counts == [15 + 45, 15 * 4 + 45, 15 * 8 + 45]  # at most one run per block


def test_speculative_tokens_move_extra_state_blocks():
    c = cost("qwen3.5-0.8b", Scheme.VLLM, 1000, num_speculative_tokens=2)
    assert c.gdn_descriptors == 12 * 6 * 3


@pytest.mark.parametrize("p_tp, d_tp, reads, ours_gdn_per_state", [(1, 2, 1, 3), (2, 1, 2, 3), (4, 2, 2, 3)],
                         ids=["1to2", "2to1", "4to2"])
def test_hetero_tp_reads_and_strided_slices(p_tp, d_tp, reads, ours_gdn_per_state):
    kw = dict(block_size=1088, ssm_dtype=DType.BFLOAT16)
    vllm = cost("qwen3.5-397b-a17b", Scheme.VLLM, 4096, p_tp=p_tp, d_tp=d_tp, **kw)
    ours = cost("qwen3.5-397b-a17b", Scheme.OURS, 4096, p_tp=p_tp, d_tp=d_tp, **kw)
    assert vllm.num_reads == ours.num_reads == reads
    assert vllm.gdn_descriptors == reads * 12 * 15
    # head slices are shorter than their stride: NIXL merges nothing
    assert vllm.served_descriptors == vllm.contiguous_descriptors == vllm.unmerged_descriptors
    assert ours.gdn_descriptors == reads * 3 * 15 * ours_gdn_per_state


def test_zero_moved_tokens_moves_only_state():
    c = cost("qwen3.5-0.8b", Scheme.VLLM, 1)
    assert c.moved_tokens == 0 and c.attention_descriptors == 0 and c.gdn_descriptors == 12 * 6


@pytest.mark.parametrize("p_tp, d_tp, rows, elements", [
    (1, 1, 15 + 45, 15 + 45),
    (1, 2, 15 + 45 * 3, 2 * 512 * 15 + 45 * 4),  # D reads its head slice: K and V slices of 512 kernel blocks
    (2, 1, 2 * 15 + 2 * 45 * 3, 2 * (2 * 512 * 15) + 2 * 45 * 4),  # two P ranks, each into a slice of D's block
    (4, 2, 15 + 2 * 45 * 3, 15 + 2 * 45 * 4),  # KV heads replicated: one head per rank on both sides, dense
], ids=["1to1", "1to2", "2to1", "4to2"])
def test_ours_nixl_elements_after_strided_expansion(p_tp, d_tp, rows, elements):
    # numbers seen from NIXL 1.5.1 prep_xfer_dlist in transfer bench: 150 / 15,540 (1->2), 300 / 31,080 (2->1)
    c = cost("qwen3.5-397b-a17b", Scheme.OURS, 8192, p_tp=p_tp, d_tp=d_tp, backend=FI, ssm_dtype=DType.BFLOAT16)
    assert (c.total_descriptors, c.nixl_elements) == (rows, elements)
