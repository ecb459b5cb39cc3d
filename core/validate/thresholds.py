"""The verdict's limits: defaults, a YAML file, then command-line flags (each later source wins)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hybridserve.core.common.errors import InputError


@dataclass(frozen=True, kw_only=True)
class Thresholds:
    # vLLM's own P/D accuracy test passes when |measured - expected| gsm8k < 0.03 (test_accuracy.py RTOL).
    max_accuracy_drop: float = 0.03
    min_candidate_accuracy: float | None = None  # None: no absolute floor
    min_token_agreement: float = 0.95
    max_logprob_drift: float = 0.05
    # A first difference where the top-2 logprob gap is under this is bf16 noise (launch's P/D check uses 0.02).
    near_tie_tolerance: float = 0.02
    max_failed_requests: float = 0  # prompts the candidate may refuse (HTTP errors) where the baseline answered
    # Prompts that may each be a regression on their own (PromptComparison.regression); None: not checked. The
    # random dataset checks it at 0: every prompt is judged, so "5 of 5 caught" means 5 prompts each failing.
    max_regressed_prompts: float | None = None


# For launch's tiny model, whose weights are random: its logits are nearly flat (top-2 gaps of one or two bf16
# steps, 0.016-0.03, are common) and it amplifies the bf16 noise of P/D (decode recomputes the last prompt token).
# Measured on 2 cores, single-sync vs pd-async, 5 seeds x 8 prompts x 16 tokens (benchmarks/HISTORY.md, Index):
# clean: token agreement 0.883-1.0, mean logprob drift 0.005-0.012; zero_after_transfer: agreement 0.45-0.90,
# drift 0.065-0.085; stale_state: agreement 0.16-0.54, drift 0.11-0.39; early_completion: NaN logprobs (HTTP 400).
# The lowest per-prompt drift limit a noise measurement may set (run.measured_limits): one bf16 step of a logit in
# [4, 8) is 2**-5, and random-weight models' chosen-token logprobs sit near -4 (CPU and H200 runs): a drift of one
# step at every position is rounding, not a corrupted state.
DRIFT_FLOOR = 2.0**-5

RANDOM_WEIGHTS = Thresholds(near_tie_tolerance=0.05, min_token_agreement=0.8, max_logprob_drift=0.04)

_FRACTIONS = ("max_accuracy_drop", "min_candidate_accuracy", "min_token_agreement")


def _check(name: str, value: Any, where: str) -> float | None:
    if value is None and name in ("min_candidate_accuracy", "max_regressed_prompts"):
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"{where}: {name} must be a number, got {value!r}")
    if value < 0 or (name in _FRACTIONS and value > 1):
        limit = "between 0 and 1" if name in _FRACTIONS else "at least 0"
        raise InputError(f"{where}: {name} must be {limit}, got {value!r}")
    return float(value)


def load_yaml(path: Path) -> dict[str, float | None]:
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise InputError(f"--thresholds {path}: not a UTF-8 text file; accepted: a YAML text file of limits") from None
    except OSError as exc:
        raise InputError(f"--thresholds {path}: cannot read it ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise InputError(f"--thresholds {path}: not YAML ({str(exc).splitlines()[0]})") from None
    if data is None:
        return {}
    known = {f.name for f in dataclasses.fields(Thresholds)}
    if not isinstance(data, dict) or set(data) - known:
        extra = sorted(set(data) - known) if isinstance(data, dict) else data
        raise InputError(f"--thresholds {path}: unknown keys {extra}; accepted: {', '.join(sorted(known))}")
    return {name: _check(name, value, f"--thresholds {path}") for name, value in data.items()}


def resolve(path: Path | None, overrides: dict[str, float | None], base: Thresholds | None = None) -> Thresholds:
    """Defaults (or `base`) <- YAML file <- flags (a flag left at None does not override)."""
    values: dict[str, float | None] = dict(vars(base)) if base is not None else {}
    values.update(load_yaml(path) if path is not None else {})
    for name, value in overrides.items():
        if value is not None:
            values[name] = _check(name, value, f"--{name.replace('_', '-')}")
    return Thresholds(**values)
