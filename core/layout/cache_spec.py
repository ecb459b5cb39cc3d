"""Per-rank memory specs of one layer kind, mirroring vLLM `v1/kv_cache_interface.py` (sizes as properties)."""

from __future__ import annotations

from dataclasses import dataclass

from hybridserve.core.model.dtypes import DType


@dataclass(frozen=True, kw_only=True)
class AttentionSpec:
    """vLLM FullAttentionSpec: one block holds K and V of `block_size` tokens for the heads of this rank."""

    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: DType
    sliding_window: int | None = None

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.num_kv_heads * self.head_size * self.dtype.num_bytes

    @property
    def page_size_bytes(self) -> int:
        return self.block_size * self.bytes_per_token


@dataclass(frozen=True, kw_only=True)
class GdnStateSpec:
    """vLLM MambaSpec for a gated-delta-net layer, per rank (`gated_delta_net_state_shape`).

    One state block holds, in this order: the conv state in DS layout (rows [Q | K | V], each row
    `conv_state_len` wide), then the SSM state [Hv, dv, dk], then padding up to `page_size_padded`.
    Worked example, Qwen3.5-397B TP1 bf16: conv 12288 x 3 x 2 = 73,728 B, SSM 64 x 128 x 128 x 2 = 2,097,152 B.
    """

    key_dim: int  # per rank: linear_num_key_heads * linear_key_head_dim / TP (rows of Q, and of K)
    value_dim: int  # per rank: linear_num_value_heads * linear_value_head_dim / TP (rows of V)
    conv_state_len: int  # conv_kernel - 1 + num_speculative_tokens
    num_value_heads: int  # per rank
    value_head_dim: int
    key_head_dim: int
    conv_dtype: DType
    ssm_dtype: DType
    page_size_padded: int | None = None

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    @property
    def conv_row_bytes(self) -> int:
        return self.conv_state_len * self.conv_dtype.num_bytes

    @property
    def conv_state_bytes(self) -> int:
        return self.conv_dim * self.conv_row_bytes

    @property
    def ssm_state_bytes(self) -> int:
        return self.num_value_heads * self.value_head_dim * self.key_head_dim * self.ssm_dtype.num_bytes

    @property
    def real_page_size_bytes(self) -> int:
        return self.conv_state_bytes + self.ssm_state_bytes

    @property
    def page_size_bytes(self) -> int:
        return self.page_size_padded if self.page_size_padded is not None else self.real_page_size_bytes

    def conv_slices(self) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
        """(offset, length) in bytes of the Q, K and V conv rows inside a page (vLLM derive_mamba_conv_split)."""
        q = self.key_dim * self.conv_row_bytes
        v = self.value_dim * self.conv_row_bytes
        return (0, q), (q, q), (2 * q, v)

    @property
    def ssm_offset_bytes(self) -> int:
        return self.conv_state_bytes
