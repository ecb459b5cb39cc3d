"""The cache settings one vLLM instance will end up with: block size, kernel block size and state dtypes.

Computed with the project's vLLM-exact layout (core/layout/rank_layout.py), so prefill and decode can be compared before
anything starts. The logical block size found here is passed to vLLM as `--block-size`: vLLM only ever raises a
block size to fit the GDN page (`Platform._align_hybrid_block_size`), and the block found already fits, so both
sides get exactly this value.
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridserve.core.layout.attention_backend import AttentionBackend
from hybridserve.core.model.dtypes import DType
from hybridserve.core.layout.rank_layout import LayoutRequest, plan_layout
from hybridserve.core.model.spec import ModelSpec
from hybridserve.core.launch.topology import Device, EngineInstance, EngineOptions

@dataclass(frozen=True, kw_only=True)
class InstanceCache:
    block_size: int  # logical (scheduler) block size, after vLLM raises it to fit the GDN page
    kernel_block_size: int  # attention kernel block inside a logical block
    ssm_dtype: DType
    conv_dtype: DType


def instance_cache(model: ModelSpec, device: Device, engine: EngineOptions, instance: EngineInstance) -> InstanceCache:
    """Raises InputError (from the layout) when the TP does not divide the model's heads."""
    requested = instance.block_size or engine.block_size
    ssm = instance.ssm_dtype or engine.ssm_dtype
    conv = instance.conv_dtype or engine.conv_dtype
    backend = AttentionBackend.CPU_ATTN if device is Device.CPU else AttentionBackend.FLASH_ATTN
    layout = plan_layout(LayoutRequest(model=model, tp=instance.tp, backend=backend, block_size=requested,
                                       ssm_dtype=ssm, conv_dtype=conv))
    return InstanceCache(block_size=layout.block_size, kernel_block_size=layout.kernel_block_size,
                         ssm_dtype=ssm, conv_dtype=conv)
