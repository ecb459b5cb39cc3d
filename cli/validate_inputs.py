"""validate's inputs that need more than Typer: trailing --prompt-len values, top-k, the tiny model's defaults."""

from __future__ import annotations

from hybridserve.cli.console import err_console
from hybridserve.core.common.errors import InputError


def random_model_defaults(dataset: str):  # noqa: ANN202
    """Launch's random-weight model: loosened limits for flat logits (RANDOM_WEIGHTS says why) and shorter prompts."""
    from hybridserve.core.deployments.target import RANDOM_MODEL_SYNTHETIC
    from hybridserve.core.validate.thresholds import RANDOM_WEIGHTS

    dataset = RANDOM_MODEL_SYNTHETIC if dataset == "synthetic" else dataset
    err_console.print("model: launch's tiny Qwen3.5 (random weights): limits loosened for flat logits "
                      f"(near-tie 0.05, agreement >= 0.8, drift <= 0.04); dataset {dataset}", highlight=False)
    return RANDOM_WEIGHTS, dataset


def trailing_lengths(lengths: list[int] | None, extra: list[str]) -> tuple[int, ...]:
    """Typer options take one value each: `--prompt-len 1024 8192` leaves '8192' as an extra argument."""
    for value in extra:
        if not value.strip().isdigit():
            raise InputError(f"unexpected argument {value!r}; accepted after --prompt-len: integers")
    return (*(lengths or []), *(int(v) for v in extra))


def top_k(value: int | None, is_random: bool) -> int:
    from hybridserve.core.deployments.client import MAX_TOP_LOGPROBS

    if value is None:
        return 5 if is_random else 2
    if not 2 <= value <= MAX_TOP_LOGPROBS:
        raise InputError(f"--top-logprobs {value}: accepted 2-{MAX_TOP_LOGPROBS} (vLLM's default --max-logprobs)")
    return value


def positive(value: int, flag: str) -> int:
    if value < 1:
        raise InputError(f"{flag} {value}: must be at least 1")
    return value
