"""Real NIXL between rank processes on this host (DRAM): byte-exact for both schemes, TP 1->1, 2->1, 1->2, 4->2,
Qwen3.5-0.8B and 397B shapes (real page sizes, few blocks), contiguous and fragmented ids, spec tokens 0 and 2.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("nixl")

from _transfer_cases import TP_CASES, case_id, plan_for, pool_size, prompt_for

from hybridserve.core.layout.descriptors import Scheme, transfer_cost
from hybridserve.transfer.blocks import Allocation, BlockPool, allocate
from hybridserve.transfer.cluster import Cluster
from hybridserve.transfer.geometry import runs

pytestmark = [pytest.mark.slow, pytest.mark.nixl_agents,  # run beside the server tests (Makefile)
              pytest.mark.xdist_group("nixl_agents")]  # see tests/conftest.py


@pytest.fixture(scope="module")
def clusters():
    """The rank processes of one TP pair, reused by every case of that pair (the cases come pair by pair); a new
    pair stops the previous one, so idle agents never compete with the running case for the two cores."""
    made: dict[tuple[int, int], Cluster] = {}

    def get(prefill_tp: int, decode_tp: int) -> Cluster:
        if (prefill_tp, decode_tp) not in made:
            for cluster in made.values():
                cluster.__exit__(None, None, None)
            made.clear()
            made[(prefill_tp, decode_tp)] = Cluster(prefill_tp, decode_tp, wait_s=90).__enter__()
        return made[(prefill_tp, decode_tp)]

    yield get
    for cluster in made.values():
        cluster.__exit__(None, None, None)


BY_TP_PAIR = sorted(TP_CASES, key=lambda case: (case[1], case[2]))


@pytest.mark.parametrize("spec", [0, 2], ids=lambda s: f"spec{s}")
@pytest.mark.parametrize("case", BY_TP_PAIR, ids=case_id)
def test_nixl_read_is_byte_exact(clusters, case, spec):
    prompt = prompt_for(case[0])
    plan = plan_for(*case, spec=spec, prompt=prompt)
    num_blocks = pool_size(plan, prompt)
    cluster = clusters(case[1], case[2])
    cluster.setup(plan, num_blocks)
    pools = BlockPool(num_blocks, seed=spec), BlockPool(num_blocks, seed=spec + 1)
    attention = next(i for i, g in enumerate(plan.decode.groups.groups) if g.kind.is_attention)
    for allocation in (Allocation.CONTIGUOUS, Allocation.FRAGMENTED):  # FRESH: test_transfer_merge.py
        for scheme in Scheme:
            blocks = allocate(*pools, plan.decode, prompt, allocation)
            moved = cluster.move(blocks, scheme, f"{allocation.value}-{scheme.value}", timeout_s=60)
            cost = transfer_cost(plan.prefill, plan.decode, prompt, scheme,
                                 num_runs=len(runs(blocks.pairs(attention))))
            for result, check in zip(moved, cluster.check(blocks, scheme), strict=True):
                assert check["is_exact"], (allocation, scheme, check["first_mismatch"])
                assert check["moved_bytes"] == result["num_bytes"] == cost.total_bytes
                assert result["num_descriptors"] == cost.total_descriptors
            pools[0].give_back(blocks.prefill)
            pools[1].give_back(blocks.decode)
