"""Descriptor builders: counts equal core's predictions, and the bytes they name are exactly the right ones.

The byte check moves the descriptors with memmove inside this process and compares against an expectation
built from the layout's meaning (transfer.verify), so address arithmetic, strides, run coalescing and TP slicing
are all checked without NIXL.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from _transfer_cases import TP_CASES, case_id, move_in_process, nixl_merged, plan_for, pool_size, prompt_for

from hybridserve.core.layout.attention_backend import AttentionBackend
from hybridserve.core.layout.descriptors import Scheme, transfer_cost
from hybridserve.core.layout.served import attention_runs
from hybridserve.transfer import descriptors_ours, descriptors_vllm
from hybridserve.transfer.blocks import Allocation, BlockPool, allocate
from hybridserve.transfer.geometry import runs
from hybridserve.transfer.regions import allocate as allocate_regions
from hybridserve.transfer.regions import prefill_seed
from hybridserve.transfer.verify import check_request

BUILD = {Scheme.VLLM: descriptors_vllm.build, Scheme.OURS: descriptors_ours.build}


def _attention_group(layout) -> int:
    return next(i for i, g in enumerate(layout.groups.groups) if g.kind.is_attention)


@pytest.mark.parametrize("backend", list(AttentionBackend), ids=lambda b: b.value)
@pytest.mark.parametrize("case", TP_CASES, ids=case_id)
@pytest.mark.parametrize("allocation", list(Allocation), ids=lambda a: a.value)
def test_counts_equal_core_prediction(case, backend, allocation):
    plan = plan_for(*case, backend=backend, prompt=8192)
    blocks = allocate(BlockPool(64, seed=1), BlockPool(64, seed=2), plan.decode, 8192, allocation)
    from hybridserve.transfer.geometry import Side

    remotes = {p: Side(layout=plan.prefill, rank=p, bases=tuple((p + 1) << 44 | j << 36 for j in range(15)),
                       num_blocks=64) for p in range(case[1])}
    num_runs = len(runs(blocks.pairs(_attention_group(plan.decode))))
    served = attention_runs(plan.decode, blocks.prefill, blocks.decode)
    for d in range(case[2]):
        local = Side(layout=plan.decode, rank=d, bases=tuple(j << 36 for j in range(15)), num_blocks=64)
        for scheme, build in BUILD.items():
            reads = build(local, remotes, blocks)
            cost = transfer_cost(plan.prefill, plan.decode, 8192, scheme, num_runs=num_runs, served_runs=served)
            assert sum(r.num_descriptors for r in reads) == cost.total_descriptors
            assert sum(r.num_attention for r in reads) == cost.attention_descriptors
            assert sum(r.num_bytes for r in reads) == cost.total_bytes
            # what NIXL posts of these lists (emulated) is core's count after the merge
            assert sum(nixl_merged(r, lambda a: a >> 36) for r in reads) == cost.served_descriptors


def test_ours_is_under_a_tenth_of_vllm_for_397b_flashinfer_8k():
    plan = plan_for("qwen3.5-397b-a17b", 1, 1, prompt=8192)
    vllm = transfer_cost(plan.prefill, plan.decode, 8192, Scheme.VLLM)
    assert vllm.total_descriptors == 15 * 8 * 67 + 12 * 15 == 8_220  # the ids vLLM hands NIXL (one per kernel block)
    for allocation in Allocation:  # contiguous: 15 + 45 = 60; fragmented: at most 15 * 8 + 45 = 165
        blocks = allocate(BlockPool(64, seed=3), BlockPool(64, seed=4), plan.decode, 8192, allocation)
        from hybridserve.transfer.geometry import Side

        side = Side(layout=plan.decode, rank=0, bases=tuple(j << 36 for j in range(15)), num_blocks=64)
        remote = Side(layout=plan.prefill, rank=0, bases=tuple(1 << 44 | j << 36 for j in range(15)), num_blocks=64)
        ours = sum(r.num_elements for r in descriptors_ours.build(side, {0: remote}, blocks))
        assert ours <= 8_220 // 10


# Every TP pair of both models, spec 0 and 2, is also moved byte-exact over NIXL (test_transfer_nixl); here, without
# NIXL, every 0.8B pair and the 397B pair with TP on both sides (the 397B's 0.5 GB per rank is what this file spends
# most of its time on: 10 s of CPU for the other three pairs)
IN_PROCESS_CASES = [c for c in TP_CASES if "397b" not in c[0] or c[1:] == (4, 2)]


@pytest.mark.parametrize("case", IN_PROCESS_CASES, ids=case_id)
@pytest.mark.parametrize("spec", [2], ids=lambda s: f"spec{s}")
def test_descriptors_move_exactly_the_right_bytes(case, spec):
    prompt = prompt_for(case[0])
    plan = plan_for(*case, spec=spec, prompt=prompt)
    num_blocks = pool_size(plan, prompt)
    prefill = [allocate_regions(plan.prefill, p, num_blocks, seed=prefill_seed(plan.prefill, p, 10))
               for p in range(case[1])]
    decode = [allocate_regions(plan.decode, d, num_blocks, seed=50 + d) for d in range(case[2])]
    pools = BlockPool(num_blocks, seed=spec), BlockPool(num_blocks, seed=spec + 7)
    for allocation in (Allocation.CONTIGUOUS, Allocation.FRAGMENTED):
        for scheme, build in BUILD.items():
            blocks = allocate(*pools, plan.decode, prompt, allocation)
            for d, regions in enumerate(decode):
                reads = build(regions.side(), {p.rank: p.side() for p in prefill}, blocks)
                move_in_process(reads)
                result = check_request(regions, plan.prefill, [p.seed for p in prefill], blocks,
                                       whole_blocks=scheme is Scheme.VLLM)
                assert result.is_exact, (allocation, scheme, d, result.first_mismatch)
                assert result.moved_bytes == sum(r.num_bytes for r in reads)
                regions.fill(blocks=[b for g in blocks.decode for b in g])
            pools[0].give_back(blocks.prefill)
            pools[1].give_back(blocks.decode)


def test_check_catches_a_misplaced_block():
    plan = plan_for("qwen3.5-0.8b", 1, 2)
    prefill = allocate_regions(plan.prefill, 0, 12, seed=1)
    decode = allocate_regions(plan.decode, 1, 12, seed=2)
    blocks = allocate(BlockPool(12, seed=0), BlockPool(12, seed=1), plan.decode, 1200, Allocation.FRAGMENTED)
    reads = descriptors_ours.build(decode.side(), {0: prefill.side()}, blocks)
    wrong = reads[0].remote.copy()
    wrong[0, 0] += plan.prefill.page_size_bytes  # first attention run read from the next block
    from dataclasses import replace

    move_in_process([replace(reads[0], remote=wrong)])
    result = check_request(decode, plan.prefill, [1], blocks, whole_blocks=False)
    assert not result.is_exact and result.first_mismatch.startswith("tensor 0")


@pytest.mark.parametrize("seed, tensor, start, num_bytes", [(10, 0, 0, 64), (2003, 14, 8 * 2_195_456, 4096),
                                                            (2003, 59, 40 * 2**30, 64)],
                         ids=["start", "397b-page-8", "past-int64"])
def test_pattern_words_are_the_seeded_affine_sequence(seed, tensor, start, num_bytes):
    """Word w of a tensor holds w * MULT + c mod 2^64 (c from seed and tensor), whichever path made it (one arange,
    the wrapping multiply-add beyond int64, or written in place into a slice of a region)."""
    import torch

    from hybridserve.transfer import regions

    c = (seed * 1_000_003 + tensor + 1) * regions._SALT
    words = [((start // 8 + i) * regions._MULT + c) % 2**64 for i in range(num_bytes // 8)]
    want = torch.tensor([w - 2**64 if w >= 2**63 else w for w in words], dtype=torch.int64).view(torch.uint8)
    assert torch.equal(regions.pattern(seed, tensor, start, num_bytes), want)
    region = torch.zeros(num_bytes + 16, dtype=torch.uint8)
    regions.pattern(seed, tensor, start, num_bytes, out=region[8:8 + num_bytes])
    assert torch.equal(region[8:8 + num_bytes], want) and not region[:8].any() and not region[-8:].any()
