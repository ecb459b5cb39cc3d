"""Make the tiny Qwen3.5 checkpoint shipped under profiles/tiny-qwen3.5 (offline, no model hub, a few MB).

Usage:  .venv/bin/python scripts/make_tiny_model.py [OUT_DIR]

What it is: transformers' own `Qwen3_5ForCausalLM` with a tiny config (3 Gated DeltaNet layers : 1 full
attention layer, the Qwen3.5 ratio), random weights from a fixed seed, saved in bf16 as safetensors; a byte-level
BPE tokenizer trained with `tokenizers` on the sentences below. Head sizes stay at 64 because vLLM's CPU GDN and
attention kernels support that size. The weights are random: the model babbles, but every layer kind, the
KV cache and the GDN conv + SSM state are exercised exactly as for a real Qwen3.5.
"""

from __future__ import annotations

import sys
from pathlib import Path

from hybridserve.core.vllm_plugin import torchvision_shim

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "profiles" / "tiny-qwen3.5"
VOCAB_SIZE = 1024
SEED = 0
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Prefill and decode run on different servers; the KV cache moves over NIXL.",
    "Gated DeltaNet keeps a recurrent state per request instead of a growing cache.",
    "One attention layer in four keeps a key value cache of every token.",
    "hello world, this is a tiny model for tests and demos.",
    "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20",
    "Question: what is two plus two? Answer: four.",
]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model(tokenizer):
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    config = Qwen3_5TextConfig(
        vocab_size=VOCAB_SIZE, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
        layer_types=["linear_attention"] * 3 + ["full_attention"],
        num_attention_heads=4, num_key_value_heads=2, head_dim=64,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64, linear_value_head_dim=64,
        linear_conv_kernel_dim=4, max_position_embeddings=4096, tie_word_embeddings=False,
        initializer_range=0.1,  # wider than 0.02: fewer near-tied logits, so greedy comparisons are sharper
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, dtype="bfloat16",
    )
    torch.manual_seed(SEED)
    return Qwen3_5ForCausalLM(config).to(torch.bfloat16).eval()


def main(out_dir: Path) -> None:
    torchvision_shim.install()  # transformers' Qwen3.5 module imports torchvision
    tokenizer = build_tokenizer()
    model = build_model(tokenizer)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out_dir)
    model.save_pretrained(out_dir, safe_serialization=True)
    num_params = sum(p.numel() for p in model.parameters())
    size = sum(f.stat().st_size for f in out_dir.iterdir())
    print(f"wrote {out_dir}: {num_params / 1e6:.2f} M parameters, {size / 1e6:.1f} MB")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUT)
