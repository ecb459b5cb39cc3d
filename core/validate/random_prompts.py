"""The `random` dataset: prompts of random token ids at given lengths, for any model, with or without a tokenizer.

Ids are drawn uniformly below the model's vocabulary size (config.json `vocab_size`, or its `text_config`'s for a
multimodal folder). vLLM accepts a prompt id up to max(tokenizer.max_token_id, model vocab size - 1) (renderers/
base.py, the out-of-vocabulary check), so ids below the model's vocabulary are valid whatever the tokenizer holds.
Prompts are sent as lists of ints: nothing is tokenized, so the lengths are exact. Seeded: one (seed, lengths,
vocabulary) gives the same prompts on every machine.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path

from hybridserve.core.common.errors import InputError
from hybridserve.core.deployments.target import default_model
from hybridserve.core.validate.dataset import AnswerKind, Dataset, Example

RANDOM = "random"
DEFAULT_PROMPTS_PER_LENGTH = 3
MAX_PROMPT_TOKENS = 1 << 20


def vocab_size(model: Path) -> int:
    """The model's vocabulary size from its config.json (the text config of a multimodal folder)."""
    path = model / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"--model {model}: cannot read config.json ({exc.strerror}); the random dataset takes "
                         "its vocabulary size from it") from None
    except ValueError:
        raise InputError(f"--model {model}: config.json is not JSON") from None
    size = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    if not isinstance(size, int) or size < 2:
        raise InputError(f"--model {model}: config.json has no vocab_size (nor text_config.vocab_size)")
    return size


def random_dataset(prompt_lens: Sequence[int], *, num_per_length: int, seed: int, num_vocab: int) -> Dataset:
    """`num_per_length` prompts of each length, ids in [0, num_vocab); in length order, then prompt order."""
    if not prompt_lens:
        raise InputError("--dataset random: needs --prompt-len, e.g. --prompt-len 1024 8192 32768")
    for length in prompt_lens:
        if not 1 <= length <= MAX_PROMPT_TOKENS:
            raise InputError(f"--prompt-len {length}: accepted: 1-{MAX_PROMPT_TOKENS} tokens")
    rng = random.Random(seed)
    examples = tuple(
        Example(prompt=tuple(rng.randrange(num_vocab) for _ in range(length)), answer=None,
                answer_kind=AnswerKind.NONE)
        for length in prompt_lens for _ in range(num_per_length))
    lengths = ",".join(str(n) for n in prompt_lens)
    return Dataset(name=f"{RANDOM}:{lengths}x{num_per_length}(seed={seed}, ids<{num_vocab})", examples=examples)


def load_random(prompt_lens: Sequence[int], *, num_prompts: int | None, seed: int, model: Path | None,
                is_started: bool) -> Dataset:
    """The CLI's `--dataset random`: the vocabulary from --model, or from the model validate starts."""
    if model is None and not is_started:
        raise InputError("--dataset random against URLs needs --model: the folder whose config.json vocab_size "
                         "bounds the token ids")
    if num_prompts is not None and num_prompts < 1:
        raise InputError(f"--num-prompts {num_prompts}: must be at least 1")

    return random_dataset(prompt_lens, num_per_length=num_prompts or DEFAULT_PROMPTS_PER_LENGTH, seed=seed,
                          num_vocab=vocab_size(model or default_model()))
