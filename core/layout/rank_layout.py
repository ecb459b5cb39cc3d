"""Per-rank memory layout: vLLM's unified block size, page size, kernel blocks, groups and shared tensors."""

from __future__ import annotations

from dataclasses import dataclass, replace

from hybridserve.core.layout.attention_backend import AttentionBackend
from hybridserve.core.layout.cache_spec import AttentionSpec, GdnStateSpec
from hybridserve.core.model.dtypes import DType
from hybridserve.core.common.arith import cdiv
from hybridserve.core.common.errors import InputError
from hybridserve.core.layout.groups import GroupLayout, group_layers
from hybridserve.core.model.spec import LayerKind, ModelSpec

# The longest context plan takes, in tokens: Qwen3.5's 1,010,000 with YaRN fits (validate's random prompts take
# the same). A request beyond it fits no vLLM --max-model-len of these models, and served.py lists its block ids.
MAX_CONTEXT_TOKENS = 1 << 20


@dataclass(frozen=True, kw_only=True)
class CacheDtypes:
    """Resolved dtypes: None in a request means 'auto' and is resolved the way vLLM resolves it."""

    kv: DType
    conv: DType
    ssm: DType


@dataclass(frozen=True, kw_only=True)
class LayoutRequest:
    model: ModelSpec
    tp: int = 1
    backend: AttentionBackend = AttentionBackend.FLASH_ATTN
    block_size: int | None = None  # --block-size; None = the platform's default (CUDA 16, CPU 128)
    kv_dtype: DType | None = None
    conv_dtype: DType | None = None  # --mamba-cache-dtype
    ssm_dtype: DType | None = None  # --mamba-ssm-cache-dtype
    num_speculative_tokens: int = 0
    hybrid_allocator: bool = True


@dataclass(frozen=True, kw_only=True)
class RankLayout:
    request: LayoutRequest
    dtypes: CacheDtypes
    attention: AttentionSpec  # block_size here is the logical (scheduler) block size
    gdn: GdnStateSpec | None  # page_size_padded set when padded up to the attention page
    kernel_block_size: int
    groups: GroupLayout

    @property
    def block_size(self) -> int:
        return self.attention.block_size

    @property
    def page_size_bytes(self) -> int:
        return self.attention.page_size_bytes

    @property
    def kernel_page_size_bytes(self) -> int:
        return self.kernel_block_size * self.attention.bytes_per_token

    @property
    def kernel_blocks_per_block(self) -> int:
        return self.block_size // self.kernel_block_size

    @property
    def num_tensors(self) -> int:
        return self.groups.num_tensors

    @property
    def padding_percent(self) -> float:
        """vLLM's log line 'Padding mamba page size by X%': relative to the real GDN page."""
        if self.gdn is None:
            return 0.0
        real = self.gdn.real_page_size_bytes
        return 100.0 * (self.page_size_bytes - real) / real


def resolve_dtypes(request: LayoutRequest) -> CacheDtypes:
    model = request.model
    kv = request.kv_dtype or model.dtype  # --kv-cache-dtype auto: the model dtype
    conv = request.conv_dtype or model.dtype  # --mamba-cache-dtype auto: the model dtype
    # --mamba-ssm-cache-dtype auto: Qwen3.5's config sets mamba_ssm_dtype (float32); else the conv dtype
    ssm = request.ssm_dtype or model.mamba_ssm_dtype or conv
    return CacheDtypes(kv=kv, conv=conv, ssm=ssm)


def plan_layout(request: LayoutRequest) -> RankLayout:
    _check(request)
    model, tp = request.model, request.tp
    dtypes = resolve_dtypes(request)
    attention = AttentionSpec(block_size=1, num_kv_heads=max(1, model.num_kv_heads // tp),
                              head_size=model.head_dim, dtype=dtypes.kv, sliding_window=model.sliding_window)
    gdn = _gdn_spec(model, tp, dtypes, request.num_speculative_tokens)
    block_size = _unified_block_size(request, attention, gdn)
    attention = replace(attention, block_size=block_size)
    if gdn is not None and attention.page_size_bytes != gdn.real_page_size_bytes:
        gdn = replace(gdn, page_size_padded=attention.page_size_bytes)
    has_fp32 = gdn is not None and DType.FLOAT32 in (dtypes.conv, dtypes.ssm)
    kernel = request.backend.kernel_block_size(block_size, has_fp32_mamba_state=has_fp32)
    return RankLayout(request=request, dtypes=dtypes, attention=attention, gdn=gdn, kernel_block_size=kernel,
                      groups=group_layers(model, hybrid_allocator=request.hybrid_allocator))


def _unified_block_size(request: LayoutRequest, attention: AttentionSpec, gdn: GdnStateSpec | None) -> int:
    """vLLM Platform._align_hybrid_block_size (mamba_cache_mode none/align).

    align = max(backend's smallest kernel block, --block-size); block = align * cdiv(gdn_page, align * attn_1tok);
    the user's block size is only ever raised. Qwen3.5-397B TP1 bf16 SSM: gdn page 2,170,880 B,
    attn 2,048 B/token -> 16 * cdiv(2170880, 32768) = 16 * 67 = 1072 tokens.
    """
    user = request.block_size or request.backend.default_block_size
    if gdn is None:
        return user
    align = max(request.backend.min_kernel_block_size, user)
    needed = align * cdiv(gdn.real_page_size_bytes, align * attention.bytes_per_token)
    return max(user, needed)


def _gdn_spec(model: ModelSpec, tp: int, dtypes: CacheDtypes, num_spec: int) -> GdnStateSpec | None:
    if not model.is_hybrid_gdn:
        return None
    gdn = model.gdn
    return GdnStateSpec(
        key_dim=gdn.key_dim // tp, value_dim=gdn.value_dim // tp,
        conv_state_len=gdn.conv_kernel - 1 + num_spec,
        num_value_heads=gdn.num_value_heads // tp, value_head_dim=gdn.value_head_dim,
        key_head_dim=gdn.key_head_dim, conv_dtype=dtypes.conv, ssm_dtype=dtypes.ssm,
    )


def _check(request: LayoutRequest) -> None:
    model, tp = request.model, request.tp
    if tp < 1:
        raise InputError(f"--tp {tp}: accepted: a positive integer")
    if model.num_attention_heads % tp:
        raise InputError(f"--tp {tp}: does not divide {model.name}'s {model.num_attention_heads} attention heads")
    if model.num_kv_heads > tp and model.num_kv_heads % tp:
        raise InputError(f"--tp {tp}: does not divide {model.name}'s {model.num_kv_heads} KV heads")
    if model.num_kv_heads < tp and tp % model.num_kv_heads:
        raise InputError(f"--tp {tp}: KV heads ({model.num_kv_heads}) are replicated only when TP is a multiple")
    if model.gdn is not None:
        for what, n in (("linear key heads", model.gdn.num_key_heads),
                        ("linear value heads", model.gdn.num_value_heads)):
            if n % tp:
                raise InputError(f"--tp {tp}: does not divide {model.name}'s {n} {what}")
    if request.block_size is not None and (request.block_size < 1 or request.block_size % 16):
        raise InputError(f"--block-size {request.block_size}: accepted: a positive multiple of 16")
    if not 0 <= request.num_speculative_tokens <= MAX_CONTEXT_TOKENS:
        raise InputError(f"--num-speculative-tokens {request.num_speculative_tokens}: accepted: "
                         f"0-{MAX_CONTEXT_TOKENS} (drafted tokens sit in the context)")
    if LayerKind.LINEAR_ATTENTION in model.layer_kinds and not request.hybrid_allocator:
        raise InputError("--no-hybrid-allocator: GDN models need vLLM's hybrid KV cache manager")
