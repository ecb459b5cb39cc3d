"""Capacity: blocks from free memory (vLLM: available // page // T) and requests that fit."""

import pytest

from hybridserve.core.layout.capacity import MemoryBudget, estimate_weights_bytes, plan_capacity
from hybridserve.core.model.dtypes import DType
from hybridserve.core.common.errors import InputError
from hybridserve.core.layout.rank_layout import LayoutRequest, plan_layout
from hybridserve.core.model.profiles import load_model
from hybridserve.core.common.arith import cdiv


@pytest.mark.parametrize("name, billions", [("qwen3.5-397b-a17b", 397), ("qwen3.5-27b", 27), ("qwen3.5-9b", 9),
                                            ("qwen3-next-80b-a3b", 80), ("qwen3.5-35b-a3b", 35)])
def test_weights_estimate_is_within_5_percent_of_the_name(name, billions):
    params = estimate_weights_bytes(load_model(name), 1) / 2
    assert abs(params / 1e9 - billions) / billions < 0.05


def test_blocks_and_requests_follow_vllm_arithmetic():
    layout = plan_layout(LayoutRequest(model=load_model("qwen3.5-0.8b"), ssm_dtype=DType.BFLOAT16))
    budget = MemoryBudget(device_memory_bytes=10 * 2**30, gpu_memory_utilization=0.5, weights_bytes=2**30)
    cap = plan_capacity(layout, budget)
    available = 5 * 2**30 - 2**30
    assert cap.num_blocks == available // layout.page_size_bytes // 6
    # one request of 4096 tokens: cdiv(4096, B) attention blocks + one state block in each of 3 GDN groups
    per_request = cdiv(4096, layout.block_size) + 3
    assert cap.blocks_per_request(layout, 4096) == per_request
    assert cap.max_requests(layout, 4096) == cap.num_blocks // per_request


def test_weights_larger_than_memory_leave_no_blocks():
    layout = plan_layout(LayoutRequest(model=load_model("qwen3.5-397b-a17b")))
    cap = plan_capacity(layout, MemoryBudget(device_memory_bytes=141 * 10**9))
    assert cap.num_blocks == 0 and cap.max_requests(layout, 1024) == 0


def test_utilization_out_of_range_is_refused():
    layout = plan_layout(LayoutRequest(model=load_model("qwen3.5-0.8b")))
    with pytest.raises(InputError, match="gpu-memory-utilization"):
        plan_capacity(layout, MemoryBudget(device_memory_bytes=2**30, gpu_memory_utilization=1.5))
