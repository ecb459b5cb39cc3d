"""Whether one request at the model's own context fits the KV cache a CUDA role's memory share leaves.

What vLLM does (0.26 and 0.32, `v1/core/kv_cache_utils.py`): with `--max-model-len` unset it serves the model's own
context and, after profiling, refuses to start when one request of that length does not fit the KV cache
(`_check_enough_kv_cache_memory`: "To serve at least one request with the model's max seq len ..."). With
`--max-model-len auto` (or -1) it instead binary-searches the longest context that fits the memory it profiled
(`_auto_fit_max_model_len`), and keeps the model's context where that fits ("full model context length ... fits").

So launch writes no flag while the context fits, and `--max-model-len auto` where plan's capacity arithmetic
(core/layout/capacity.py: `num_blocks = free // page // T`, one request taking `blocks_per_request` blocks) says it
may not: vLLM then picks the length from its own profile, which plan cannot see (activations, CUDA graphs, the CUDA
context). Plan counts the weights only, so it asks for `auto` once one request would take more than HEADROOM of the
KV cache plan estimates; `auto` changes nothing where the context fits after all. The dry run shows plan's numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridserve.core.layout.capacity import MemoryBudget, plan_capacity
from hybridserve.core.layout.rank_layout import RankLayout

HEADROOM = 0.5  # of plan's KV estimate, kept for what vLLM's profile takes and plan does not count
GIB = 2**30


@dataclass(frozen=True, kw_only=True)
class ContextFit:
    model_context_tokens: int | None  # the model's own context; None: its config names none (vLLM assumes 2048)
    memory_bytes: int | None  # the GPU's total memory; None: not known here (no GPU seen, no --gpu-memory)
    share: float  # this role's --gpu-memory-utilization
    kv_cache_bytes: int | None = None  # plan's estimate of the role's KV cache (weights taken off)
    request_bytes: int | None = None  # one request at the model's context
    largest_fit_tokens: int | None = None  # the longest single request plan's estimate holds

    @property
    def is_checked(self) -> bool:
        return self.request_bytes is not None and self.kv_cache_bytes is not None

    @property
    def needs_auto(self) -> bool:
        """One request at the model's context takes more than HEADROOM of plan's KV estimate."""
        return self.is_checked and self.request_bytes > HEADROOM * self.kv_cache_bytes

    @property
    def reason(self) -> str:
        context = (f"the model's context, {self.model_context_tokens:,} tokens" if self.model_context_tokens
                   else "the model's context (its config names none: vLLM assumes 2,048)")
        if not self.is_checked:
            return (f"vLLM's default: {context}; not checked against GPU memory (none known here; "
                    "--gpu-memory GiB|h200 checks it)")
        where = (f"the ~{self.kv_cache_bytes / GIB:,.1f} GiB KV cache plan estimates for share {self.share:g} of "
                 f"{self.memory_bytes / GIB:,.0f} GiB")
        need = f"one request at {context} takes {self.request_bytes / GIB:,.2f} GiB of {where}"
        if not self.needs_auto:
            return f"vLLM's default, {need}"
        fit = (f"plan's longest fit: {self.largest_fit_tokens:,} tokens" if self.largest_fit_tokens
               else "plan fits not even one token")
        return (f"auto, vLLM fits the context to the KV cache it profiles: {need}, more than {HEADROOM:.0%} (vLLM "
                f"refuses to start where one request does not fit); {fit}")


def context_fit(layout: RankLayout, *, memory_bytes: int | None, share: float) -> ContextFit:
    """Plan's answer for one CUDA engine: its layout (the model and TP inside), its GPU's memory and share."""
    context = layout.request.model.max_context_tokens
    if memory_bytes is None or context is None:
        return ContextFit(model_context_tokens=context, memory_bytes=memory_bytes, share=share)
    capacity = plan_capacity(layout, MemoryBudget(device_memory_bytes=memory_bytes, gpu_memory_utilization=share))
    per_block = layout.page_size_bytes * layout.num_tensors

    def fits(tokens: int) -> bool:
        return capacity.blocks_per_request(layout, tokens) <= capacity.num_blocks

    low, high = 0, context  # vLLM's own search (`_estimate_max_model_len_from_groups`): the longest that fits
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if fits(mid) else (low, mid - 1)
    return ContextFit(model_context_tokens=context, memory_bytes=memory_bytes, share=share,
                      kv_cache_bytes=capacity.num_blocks * per_block,
                      request_bytes=capacity.blocks_per_request(layout, context) * per_block,
                      largest_fit_tokens=low)
