"""plan's vLLM count after NIXL's merge equals what a fresh vLLM 0.26 server posted on the H200 (2026-12-02).

The model: scripts/make_gdn_bench_model.py /tmp/m60 --tp 1 --layers 60 --hidden 1024 (45 GDN + 15 attention
layers, Qwen3.5-397B TP1 per-layer geometry), float32 SSM state, FlashAttention: 2096-token blocks of 131 kernel
blocks of 16, 15 shared tensors. Served: 195 / 210 / 280 descriptors per request at 1k / 8k / 32k.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from hybridserve.core.layout.descriptors import Scheme, transfer_cost
from hybridserve.core.layout.merge import num_runs
from hybridserve.core.layout.plan import PlanRequest, make_plan
from hybridserve.core.layout.rank_layout import LayoutRequest, plan_layout
from hybridserve.core.layout.served import FreeBlockQueue, ServedScenario, served_runs
from hybridserve.core.model.profiles import load_model

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from make_gdn_bench_model import geometry  # noqa: E402


@pytest.fixture(scope="module")
def m60(tmp_path_factory):
    folder = tmp_path_factory.mktemp("m60")
    config = dict(geometry(1, num_layers=60, hidden_size=1024), architectures=["Qwen3_5ForCausalLM"],
                  model_type="qwen3_5_text", mamba_ssm_dtype="float32", eos_token_id=0, pad_token_id=0)
    (folder / "config.json").write_text(json.dumps(config))
    return load_model(str(folder))


def test_m60_layout_is_the_h200_one(m60):
    layout = plan_layout(LayoutRequest(model=m60))
    assert (layout.block_size, layout.kernel_block_size, layout.num_tensors) == (2096, 16, 15)


def test_plan_equals_the_h200_served_counts(m60):
    plan = make_plan(PlanRequest(layout=LayoutRequest(model=m60), prompt_tokens=(1024, 8192, 32768)))
    served = [r.vllm.served_descriptors for r in plan.requests]
    gdn = 45 * 4  # 3 conv pieces + the SSM state per GDN layer: length < stride, NIXL never merges them
    # mean attention runs of the 3 measured requests a length after a 1k warm-up: 1k (1, 1, 1), 8k of 4 blocks
    # (1, 4, 1), 32k of 16 blocks (5, 10, 5): LIFO reuse hands a request the last one's blocks descending
    assert served == [15 * 1 + gdn, 15 * 2 + gdn, 15 * 20 / 3 + gdn] == [195, 210, 280]
    assert [r.vllm.unmerged_descriptors for r in plan.requests] == [15 * 131 * n + gdn for n in (1, 4, 16)]
    assert [r.vllm.fragmented_descriptors for r in plan.requests] == [15 * n + gdn for n in (1, 4, 16)]
    # after a mixed load the H200 posted 410 for a 32k prompt: under the fragmented bound
    assert 410 <= plan.requests[2].vllm.fragmented_descriptors == 420


def test_a_fresh_servers_first_request_is_one_run(m60):
    layout = plan_layout(LayoutRequest(model=m60))
    assert served_runs(layout, layout, [32768, 32768, 32768, 1024], output_tokens=16) == [1, 16, 1, 1]
    first = transfer_cost(layout, layout, 32768, Scheme.VLLM)  # no scenario: one run per attention group
    assert first.served_descriptors == first.contiguous_descriptors == 15 + 180


def test_free_queue_hands_back_the_last_request_reversed():
    queue = FreeBlockQueue()
    gdn, attention = queue.take(1), queue.take(4)
    assert (gdn, attention) == ([1], [2, 3, 4, 5])
    queue.free([gdn, attention])  # group by group, each reversed, before the head
    assert queue.take(6) == [5, 4, 3, 2, 1, 6]


@pytest.mark.parametrize("remote, local, runs", [([4, 5, 6], [9, 10, 11], 1), ([4, 5, 7], [9, 10, 11], 2),
                                                 ([7, 6, 5], [1, 2, 3], 3), ([], [], 0)],
                         ids=["both-up", "remote-gap", "descending", "empty"])
def test_runs_need_consecutive_ids_on_both_sides(remote, local, runs):
    assert num_runs(remote, local) == runs


def test_scenario_is_reported_and_changes_the_count(m60):
    one = make_plan(PlanRequest(layout=LayoutRequest(model=m60), prompt_tokens=(32768,),
                                served=ServedScenario(num_warmup=0, repeats=1)))
    assert one.requests[0].vllm.served_descriptors == 195  # nothing before it: one ascending run
