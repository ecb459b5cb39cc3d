"""Token-id prompts: random ids below the model's vocabulary size, so any model works offline, tokenizer or not.

vLLM accepts a list of ints as a /v1/completions prompt and checks each id against the larger of the tokenizer's
and the model's vocabulary (renderers/base.py `validate_token_ids`), so ids in [0, vocab_size) are always taken.
The special ids a config names (`*_token_id`: image and video placeholders, bos/eos) are left out, so a multimodal
config's placeholder never asks for an image. Each prompt starts from fresh random ids: no two share a prefix, and
with a new prompt seed per run a server's prefix cache never serves a repeated run.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from hybridserve.core.common.errors import InputError


def special_token_ids(config: dict[str, Any]) -> set[int]:
    """Every id a config (and its nested text/vision configs) names in a field ending with `token_id`."""
    found: set[int] = set()
    for key, value in config.items():
        if isinstance(value, dict):
            found |= special_token_ids(value)
        elif key.endswith("token_id") and isinstance(value, int):
            found.add(value)
        elif key.endswith("token_id") and isinstance(value, list):
            found |= {v for v in value if isinstance(v, int)}
    return found


def read_config(model: Path) -> dict[str, Any]:
    """The config.json of a model folder (or the file itself)."""
    path = model / "config.json" if model.is_dir() else model
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"--model {model}: no readable config.json ({exc}); accepted: a model folder or its "
                         "config.json, or give --vocab-size") from None


def vocab_size_of(config: dict[str, Any]) -> int:
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    size = text.get("vocab_size", config.get("vocab_size"))
    if not isinstance(size, int) or size < 2:
        raise InputError(f"config vocab_size {size!r}: accepted: a config with a vocab_size of 2 or more, or give "
                         "--vocab-size")
    return size


def make_prompts(lengths: tuple[int, ...], *, vocab_size: int, excluded: set[int], rng: random.Random,
                 ) -> tuple[tuple[int, ...], ...]:
    """One prompt of random ids per length, none of them in `excluded`."""
    allowed = vocab_size - len({i for i in excluded if 0 <= i < vocab_size})
    if allowed < 1:
        raise InputError(f"--vocab-size {vocab_size}: every id is a special token; accepted: a larger vocabulary")
    out = []
    for length in lengths:
        ids = []
        while len(ids) < length:
            token = rng.randrange(vocab_size)
            if token not in excluded:
                ids.append(token)
        out.append(tuple(ids))
    return tuple(out)
