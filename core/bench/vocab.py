"""The vocabulary prompts are drawn from: --vocab-size, else the model's config (given, or the folder the server
loaded when it is on this machine)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from hybridserve.core.bench.prompts import read_config, special_token_ids, vocab_size_of
from hybridserve.core.bench.served_model import ServedModel
from hybridserve.core.common.errors import InputError


@dataclass(frozen=True, kw_only=True)
class Vocabulary:
    size: int
    excluded: frozenset[int] = field(default_factory=frozenset)  # the config's special ids
    source: str = "--vocab-size"


def find_vocabulary(size: int | None, model: Path | None, served: ServedModel) -> Vocabulary:
    folder = model or served.local_folder
    if size is not None:
        if size < 2:
            raise InputError(f"--vocab-size {size}: accepted: 2 or more")
        excluded = special_token_ids(read_config(folder)) if folder else set()
        return Vocabulary(size=size, excluded=frozenset(excluded))
    if folder is None:
        raise InputError(f"endpoint model {served.name} (root {served.root}): its config is not on this machine; "
                         "accepted: --model FOLDER (its config.json) or --vocab-size N")
    config = read_config(folder)
    return Vocabulary(size=vocab_size_of(config), excluded=frozenset(special_token_ids(config)),
                      source=f"{folder}/config.json")
