"""How many blocks fit on a rank and how many requests of a length they hold (vLLM `get_kv_cache_config`)."""

from __future__ import annotations

from dataclasses import dataclass

from hybridserve.core.layout.descriptors import blocks_kept
from hybridserve.core.common.errors import InputError
from hybridserve.core.layout.rank_layout import RankLayout
from hybridserve.core.model.spec import LayerKind, ModelSpec


# vLLM's --gpu-memory-utilization default: CacheConfig.gpu_memory_utilization, 0.92 in 0.26 and in 0.32
VLLM_GPU_MEMORY_UTILIZATION = 0.92


@dataclass(frozen=True, kw_only=True)
class MemoryBudget:
    device_memory_bytes: int
    gpu_memory_utilization: float = VLLM_GPU_MEMORY_UTILIZATION
    weights_bytes: int | None = None  # None: estimated from the config
    reserved_bytes: int = 0  # activations, CUDA graphs, NCCL buffers: vLLM profiles these at start-up


@dataclass(frozen=True, kw_only=True)
class Capacity:
    weights_bytes: int
    kv_cache_bytes: int
    num_blocks: int

    def blocks_per_request(self, layout: RankLayout, prompt_tokens: int) -> int:
        """Blocks the global pool gives one request: every group takes its own block ids."""
        states = 1 + layout.request.num_speculative_tokens  # mamba_cache_mode none: 1 + spec state blocks
        return sum(blocks_kept(layout, g, prompt_tokens) if g.kind.is_attention else states
                   for g in layout.groups.groups)

    def max_requests(self, layout: RankLayout, prompt_tokens: int) -> int:
        return self.num_blocks // max(1, self.blocks_per_request(layout, prompt_tokens))

    def vllm_max_concurrency(self, layout: RankLayout, max_model_len: int) -> float:
        """What vLLM logs as "Maximum concurrency for L tokens per request" (and exports as cache_config_info's
        kv_cache_max_concurrency): the pool's blocks over the blocks one request of `max_model_len` takes from every
        group. Mirrors kv_cache_utils.get_max_concurrency_for_kv_cache_config: 0.32 sums cdiv(max memory, page) over
        the groups; 0.26 divides the groups' summed max memory by the one page, the same count when, as the hybrid
        allocator makes them, every group has the page (full attention and GDN groups, mamba_cache_mode none)."""
        return self.num_blocks / max(1, self.blocks_per_request(layout, max_model_len))

    def vllm_kv_cache_tokens(self, layout: RankLayout, max_model_len: int) -> int:
        """vLLM's "KV cache size: N tokens" (kv_cache_size_tokens): int(max concurrency x max_model_len), not the
        tokens the blocks hold (kv_cache_utils.get_kv_cache_capacity, 0.26 and 0.32)."""
        return int(self.vllm_max_concurrency(layout, max_model_len) * max_model_len)


def estimate_weights_bytes(model: ModelSpec, tp: int) -> int:
    """Parameters from the config times the model dtype, split over TP (norms and biases ignored)."""
    h, gdn, ffn = model.hidden_size, model.gdn, model.ffn
    embed = model.vocab_size * h * (1 if model.tie_word_embeddings else 2)
    q_out = model.num_attention_heads * model.head_dim * (2 if model.attn_output_gate else 1)
    attn = h * q_out + 2 * h * model.num_kv_heads * model.head_dim + model.num_attention_heads * model.head_dim * h
    linear = 0
    if gdn is not None:
        linear = h * (gdn.conv_dim + gdn.value_dim + 2 * gdn.num_value_heads) + gdn.conv_dim * gdn.conv_kernel \
            + gdn.value_dim * h
    if ffn.num_experts:
        mlp = 3 * h * (ffn.num_experts * ffn.moe_intermediate_size + ffn.shared_expert_intermediate_size) \
            + h * ffn.num_experts
    else:
        mlp = 3 * h * ffn.intermediate_size
    per_kind = {LayerKind.LINEAR_ATTENTION: linear}
    layers = sum(per_kind.get(kind, attn) + mlp for kind in model.layer_kinds)
    return (embed + layers) * model.dtype.num_bytes // tp


def blocks_held(layout: RankLayout, kv_cache_bytes: int) -> int:
    """Blocks a KV cache of `kv_cache_bytes` holds (vLLM `get_kv_cache_config`: each block id spans all T shared
    tensors of one page each)."""
    return max(0, kv_cache_bytes) // layout.page_size_bytes // layout.num_tensors


def plan_capacity(layout: RankLayout, budget: MemoryBudget) -> Capacity:
    """num_blocks = available // page // T (vLLM: each block id spans all T shared tensors)."""
    if not 0 < budget.gpu_memory_utilization <= 1:
        raise InputError(f"--gpu-memory-utilization {budget.gpu_memory_utilization}: accepted: in (0, 1]")
    weights = budget.weights_bytes
    if weights is None:
        weights = estimate_weights_bytes(layout.request.model, layout.request.tp)
    available = int(budget.device_memory_bytes * budget.gpu_memory_utilization) - weights - budget.reserved_bytes
    return Capacity(weights_bytes=weights, kv_cache_bytes=max(0, available), num_blocks=blocks_held(layout, available))
