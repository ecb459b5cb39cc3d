"""A Plan as plain data (for --json / --yaml), named as vLLM names the quantities."""

from __future__ import annotations

from typing import Any

from hybridserve.core.layout.descriptors import TransferCost
from hybridserve.core.layout.rank_layout import RankLayout
from hybridserve.core.layout.plan import Plan


def layout_dict(layout: RankLayout) -> dict[str, Any]:
    req, gdn = layout.request, layout.gdn
    return {
        "tp": req.tp,
        "attention_backend": req.backend.value,
        "kv_cache_dtype": layout.dtypes.kv.value,
        "mamba_cache_dtype": layout.dtypes.conv.value,
        "mamba_ssm_cache_dtype": layout.dtypes.ssm.value,
        "attention_bytes_per_token_per_layer": layout.attention.bytes_per_token,
        "num_kv_heads_per_rank": layout.attention.num_kv_heads,
        "conv_state_bytes": gdn.conv_state_bytes if gdn else None,
        "ssm_state_bytes": gdn.ssm_state_bytes if gdn else None,
        "gdn_page_size_bytes": gdn.real_page_size_bytes if gdn else None,
        "block_size": layout.block_size,
        "page_size_bytes": layout.page_size_bytes,
        "padding_percent": round(layout.padding_percent, 4),
        "kernel_block_size": layout.kernel_block_size,
        "kernel_blocks_per_block": layout.kernel_blocks_per_block,
        "num_tensors": layout.num_tensors,
        "groups": [{"kind": g.kind.value, "layers": list(g.layers)} for g in layout.groups.groups],
    }


def cost_dict(cost: TransferCost) -> dict[str, Any]:
    return {
        "num_reads": cost.num_reads,
        "attention_descriptors": cost.attention_descriptors,
        "gdn_descriptors": cost.gdn_descriptors,
        "total_descriptors": cost.total_descriptors,
        "served_descriptors": round(cost.served_descriptors, 3),
        "contiguous_descriptors": cost.contiguous_descriptors,
        "unmerged_descriptors": cost.unmerged_descriptors,
        "fragmented_descriptors": cost.fragmented_descriptors,
        "nixl_elements": cost.nixl_elements,
        "attention_bytes": cost.attention_bytes,
        "gdn_bytes": cost.gdn_bytes,
        "total_bytes": cost.total_bytes,
    }


def plan_dict(plan: Plan) -> dict[str, Any]:
    model = plan.request.layout.model
    cap = plan.capacity
    return {
        "model": model.name,
        "model_type": model.model_type,
        "num_layers": model.num_layers,
        "prefill": layout_dict(plan.prefill),
        "decode": layout_dict(plan.decode),
        "num_speculative_tokens": plan.request.layout.num_speculative_tokens,
        "fragmentation_runs": plan.request.num_runs,
        "served_scenario": {"num_warmup": plan.request.served.num_warmup, "repeats": plan.request.served.repeats,
                            "output_tokens": plan.request.served.output_tokens},
        "capacity": None if cap is None else {
            "weights_bytes": cap.weights_bytes, "kv_cache_bytes": cap.kv_cache_bytes, "num_blocks": cap.num_blocks,
            "gpu_memory_utilization": plan.request.budget.gpu_memory_utilization if plan.request.budget else None,
        },
        "requests": [
            {"prompt_tokens": r.prompt_tokens, "moved_tokens": r.vllm.moved_tokens, "max_requests": r.max_requests,
             "vllm_max_concurrency": r.vllm_max_concurrency, "vllm": cost_dict(r.vllm), "ours": cost_dict(r.ours)}
            for r in plan.requests
        ],
    }
