"""The model spec: one frozen value built from a Hugging Face config.json (text part)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from hybridserve.core.model.dtypes import DType
from hybridserve.core.common.errors import InputError

# model_type values whose layouts this project knows (vLLM model classes in comments).
SUPPORTED_MODEL_TYPES = {
    "qwen3_5": "Qwen3_5ForConditionalGeneration",
    "qwen3_5_text": "Qwen3_5ForCausalLM",
    "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration",
    "qwen3_5_moe_text": "Qwen3_5MoeForCausalLM",
    "qwen3_next": "Qwen3NextForCausalLM",
    "gemma3": "Gemma3ForConditionalGeneration",
    "gemma3_text": "Gemma3ForCausalLM",
}


class LayerKind(enum.Enum):
    FULL_ATTENTION = "full_attention"
    SLIDING_ATTENTION = "sliding_attention"
    LINEAR_ATTENTION = "linear_attention"  # Gated DeltaNet

    @property
    def is_attention(self) -> bool:
        return self is not LayerKind.LINEAR_ATTENTION


@dataclass(frozen=True, kw_only=True)
class GdnSpec:
    """Gated DeltaNet head geometry (vLLM `gated_delta_net_state_shape` inputs)."""

    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int

    @property
    def key_dim(self) -> int:
        return self.num_key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_value_heads * self.value_head_dim

    @property
    def conv_dim(self) -> int:
        # conv runs over the concatenated [q | k | v] projections
        return 2 * self.key_dim + self.value_dim


@dataclass(frozen=True, kw_only=True)
class FeedForwardSpec:
    """Only what the weights estimate needs."""

    intermediate_size: int = 0
    num_experts: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    name: str
    model_type: str
    layer_kinds: tuple[LayerKind, ...]
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    dtype: DType
    gdn: GdnSpec | None = None
    mamba_ssm_dtype: DType | None = None  # HF `mamba_ssm_dtype`; None: the model dtype
    sliding_window: int | None = None
    attn_output_gate: bool = False
    tie_word_embeddings: bool = False
    ffn: FeedForwardSpec = FeedForwardSpec()
    max_context_tokens: int | None = None  # the model's own context (vLLM's derived max_model_len); None: unknown
    source: str | None = None

    @property
    def num_layers(self) -> int:
        return len(self.layer_kinds)

    def layers_of(self, kind: LayerKind) -> tuple[int, ...]:
        return tuple(i for i, k in enumerate(self.layer_kinds) if k is kind)

    @property
    def is_hybrid_gdn(self) -> bool:
        return self.gdn is not None and bool(self.layers_of(LayerKind.LINEAR_ATTENTION))


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """Multimodal configs nest the language model under `text_config`; vLLM reads that as hf_text_config."""
    inner = config.get("text_config")
    if isinstance(inner, dict):
        merged = {k: v for k, v in config.items() if k != "text_config"}
        merged.update(inner)
        merged["model_type"] = config.get("model_type", inner.get("model_type"))
        return merged
    return config
