"""Build a ModelSpec from the fields of a Hugging Face config.json; refuse what cannot be laid out."""

from __future__ import annotations

from typing import Any

from hybridserve.core.model.dtypes import DType
from hybridserve.core.common.errors import InputError
from hybridserve.core.model.spec import (
    SUPPORTED_MODEL_TYPES, FeedForwardSpec, GdnSpec, LayerKind, ModelSpec, text_config,
)


def spec_from_config(config: Any, *, name: str, source: str | None = None) -> ModelSpec:
    if not isinstance(config, dict):
        raise InputError(f"model {name}: config must be a JSON object, got {type(config).__name__}")
    cfg = text_config(config)
    model_type = cfg.get("model_type")
    if not isinstance(model_type, str) or model_type not in SUPPORTED_MODEL_TYPES:
        accepted = ", ".join(sorted(SUPPORTED_MODEL_TYPES))
        raise InputError(f"model {name}: unsupported model_type {model_type!r}; supported: {accepted}")
    field = _Fields(cfg, name)
    num_layers = field.positive_int("num_hidden_layers")
    heads = field.positive_int("num_attention_heads")
    hidden = field.positive_int("hidden_size")
    head_dim = field.positive_int("head_dim", default=hidden // heads if hidden % heads == 0 else None)
    kinds = _layer_kinds(cfg, field, num_layers)
    gdn = None
    if LayerKind.LINEAR_ATTENTION in kinds:
        gdn = GdnSpec(
            num_key_heads=field.positive_int("linear_num_key_heads"),
            num_value_heads=field.positive_int("linear_num_value_heads"),
            key_head_dim=field.positive_int("linear_key_head_dim"),
            value_head_dim=field.positive_int("linear_value_head_dim"),
            conv_kernel=field.positive_int("linear_conv_kernel_dim"),
        )
        if gdn.num_value_heads % gdn.num_key_heads:
            raise InputError(
                f"model {name}: linear_num_value_heads {gdn.num_value_heads} is not a multiple of "
                f"linear_num_key_heads {gdn.num_key_heads}; accepted: a whole GVA ratio"
            )
    sliding = cfg.get("sliding_window") if LayerKind.SLIDING_ATTENTION in kinds else None
    ssm = cfg.get("mamba_ssm_dtype")
    return ModelSpec(
        name=name,
        model_type=model_type,
        layer_kinds=kinds,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=field.positive_int("num_key_value_heads", default=heads),
        head_dim=head_dim,
        vocab_size=field.positive_int("vocab_size"),
        dtype=DType.parse(cfg.get("dtype") or cfg.get("torch_dtype") or "bfloat16", what=f"model {name}: dtype"),
        gdn=gdn,
        mamba_ssm_dtype=DType.parse(ssm, what=f"model {name}: mamba_ssm_dtype") if ssm else None,
        sliding_window=field.positive_int("sliding_window") if sliding is not None else None,
        attn_output_gate=bool(cfg.get("attn_output_gate", False)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        ffn=FeedForwardSpec(
            intermediate_size=field.positive_int("intermediate_size", default=0, allow_zero=True),
            num_experts=field.positive_int("num_experts", default=0, allow_zero=True),
            moe_intermediate_size=field.positive_int("moe_intermediate_size", default=0, allow_zero=True),
            shared_expert_intermediate_size=field.positive_int(
                "shared_expert_intermediate_size", default=0, allow_zero=True),
        ),
        max_context_tokens=_context_tokens(cfg),
        source=source,
    )


# The keys vLLM reads a model's context from, the smallest present winning (vLLM 0.26
# transformers_utils/model_arch_config_convertor.py `derive_max_model_len_and_key`, the same list in 0.32). vLLM then
# scales it by a RoPE factor (yarn, ...); the Qwen3.5 and Qwen3-Next configs have none ("default" RoPE).
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")


def _context_tokens(cfg: dict[str, Any]) -> int | None:
    found = [cfg[key] for key in CONTEXT_KEYS if isinstance(cfg.get(key), int) and cfg[key] > 0]
    return min(found) if found else None


def _layer_kinds(cfg: dict[str, Any], field: _Fields, num_layers: int) -> tuple[LayerKind, ...]:
    types = cfg.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != num_layers:
            raise InputError(
                f"model {field.name}: layer_types must list {num_layers} entries (num_hidden_layers)")
        known = {k.value: k for k in LayerKind}
        bad = [t for t in types if t not in known]
        if bad:
            raise InputError(
                f"model {field.name}: unknown layer type {bad[0]!r}; accepted: {', '.join(known)}")
        return tuple(known[t] for t in types)
    if "full_attention_interval" in cfg:  # Qwen3-Next / Qwen3.5: layer i is full attention when (i+1) % n == 0
        n = field.positive_int("full_attention_interval")
        return tuple(LayerKind.FULL_ATTENTION if (i + 1) % n == 0 else LayerKind.LINEAR_ATTENTION
                     for i in range(num_layers))
    if "sliding_window_pattern" in cfg:  # Gemma 3: every n-th layer is global
        n = field.positive_int("sliding_window_pattern")
        return tuple(LayerKind.FULL_ATTENTION if (i + 1) % n == 0 else LayerKind.SLIDING_ATTENTION
                     for i in range(num_layers))
    return (LayerKind.FULL_ATTENTION,) * num_layers


class _Fields:
    """Reads integer fields and names the offending one when it is missing or wrong."""

    def __init__(self, cfg: dict[str, Any], name: str) -> None:
        self.cfg, self.name = cfg, name

    def positive_int(self, key: str, *, default: int | None = None, allow_zero: bool = False) -> int:
        value = self.cfg.get(key, default)
        if value is None:
            raise InputError(f"model {self.name}: config field {key!r} is missing; accepted: a positive integer")
        if isinstance(value, bool) or not isinstance(value, int) or value < 0 or (value == 0 and not allow_zero):
            raise InputError(f"model {self.name}: config field {key!r} = {value!r}; accepted: a positive integer")
        return value
