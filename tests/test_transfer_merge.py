"""Real NIXL (DRAM, two rank processes): vLLM's scheme posted as NixlConnector posts it (whole lists prepared,
descriptor ids into them) is merged by NIXL to exactly core's served count, request after request of a fresh
server (vLLM's LIFO free queue: the second request gets the first one's blocks descending)."""

from __future__ import annotations

from dataclasses import replace

import pytest

pytest.importorskip("torch")
pytest.importorskip("nixl")

from _transfer_cases import plan_for

from hybridserve.core.layout.descriptors import Scheme, transfer_cost
from hybridserve.core.layout.plan import make_plan
from hybridserve.core.layout.served import ServedScenario, attention_runs
from hybridserve.transfer.blocks import Allocation, BlockPool, allocate
from hybridserve.transfer.cluster import Cluster

pytestmark = [pytest.mark.slow, pytest.mark.nixl_agents, pytest.mark.xdist_group("nixl_agents")]

PROMPT = 1500  # Qwen3.5-0.8B, FlashInfer: 3 blocks of 544 tokens, 17 kernel blocks of 32 each; 6 tensors


def test_nixl_merges_vllms_ids_to_the_served_count():
    plan = plan_for("qwen3.5-0.8b", 1, 1, prompt=PROMPT)
    assert (plan.decode.kernel_blocks_per_block, plan.decode.num_tensors) == (17, 6)
    pools = BlockPool(24, seed=0), BlockPool(24, seed=1)
    merged, predicted, runs = [], [], []
    with Cluster(1, 1, wait_s=90) as cluster:
        cluster.setup(plan, 24)
        for k in range(3):
            blocks = allocate(*pools, plan.decode, PROMPT, Allocation.FRESH)
            try:
                moved = cluster.move(blocks, Scheme.VLLM, f"fresh-{k}", timeout_s=60)
                assert all(c["is_exact"] for c in cluster.check(blocks, Scheme.VLLM))
            finally:
                pools[0].give_back(blocks.prefill)
                pools[1].give_back(blocks.decode)
            runs.append(attention_runs(plan.decode, blocks.prefill, blocks.decode))
            merged.append(moved[0]["num_merged"])
            predicted.append(transfer_cost(plan.prefill, plan.decode, PROMPT, Scheme.VLLM,
                                           served_runs=runs[-1]).served_descriptors)
            assert moved[0]["num_descriptors"] == 6 * 3 * 17 + 6 * 12  # the ids vLLM hands NIXL
    assert runs == [1, 3, 1]  # ascending, then the same blocks back descending, then ascending again
    assert merged == predicted == [6 * r + 6 * 12 for r in runs]
    # and plan's scenario of the same three requests (no warm-up, no output tokens) gives their mean
    served = make_plan(replace(plan.request, served=ServedScenario(num_warmup=0, repeats=3, output_tokens=0)))
    assert served.requests[0].vllm.served_descriptors == sum(merged) / 3
