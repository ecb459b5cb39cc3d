"""The deployment settings that decide a rank's layout: the one seam from settings to a LayoutRequest.

`plan` builds CacheSettings from its options; `launch` builds them from the topology's engine options (an instance
may override some) and passes the same values to vLLM as flags. Both then get the layout from `layout_request`, so
`launch --dry-run` and `plan` cannot describe different deployments for the same settings.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hybridserve.core.layout.attention_backend import AttentionBackend
from hybridserve.core.layout.rank_layout import LayoutRequest
from hybridserve.core.model.dtypes import DType
from hybridserve.core.model.spec import ModelSpec


@dataclass(frozen=True, kw_only=True)
class CacheSettings:
    """vLLM's engine flags that change the KV cache / GDN state layout; None means vLLM's `auto`."""

    attention_backend: AttentionBackend = AttentionBackend.FLASH_ATTN
    model_dtype: DType | None = None  # --dtype (None: the config's dtype)
    block_size: int | None = None  # --block-size before vLLM raises it to fit the GDN page
    kv_cache_dtype: DType | None = None  # --kv-cache-dtype
    mamba_cache_dtype: DType | None = None  # --mamba-cache-dtype (conv state)
    mamba_ssm_cache_dtype: DType | None = None  # --mamba-ssm-cache-dtype
    num_speculative_tokens: int = 0  # --speculative-config num_speculative_tokens (MTP)
    hybrid_allocator: bool = True  # --no-disable-hybrid-kv-cache-manager


def layout_request(model: ModelSpec, tp: int, settings: CacheSettings) -> LayoutRequest:
    """The LayoutRequest of one rank of `model` at `tp` under `settings` (plan and launch both call this)."""
    if settings.model_dtype is not None:
        model = replace(model, dtype=settings.model_dtype)
    return LayoutRequest(model=model, tp=tp, backend=settings.attention_backend, block_size=settings.block_size,
                         kv_dtype=settings.kv_cache_dtype, conv_dtype=settings.mamba_cache_dtype,
                         ssm_dtype=settings.mamba_ssm_cache_dtype,
                         num_speculative_tokens=settings.num_speculative_tokens,
                         hybrid_allocator=settings.hybrid_allocator)
