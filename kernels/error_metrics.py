"""Error metrics against the judge. NaN or inf anywhere in the result is an error of +inf: it never passes."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True, kw_only=True)
class Error:
    relative_l2: float  # ||actual - expected|| / ||expected||; inf when actual has NaN/inf or shapes differ
    max_abs: float

    def is_within(self, tolerance: float) -> bool:
        return math.isfinite(self.relative_l2) and self.relative_l2 <= tolerance


def error_of(actual: torch.Tensor | None, expected: torch.Tensor) -> Error:
    if actual is None or tuple(actual.shape) != tuple(expected.shape):
        return Error(relative_l2=math.inf, max_abs=math.inf)
    a, e = actual.detach().to("cpu", torch.float64), expected.detach().to("cpu", torch.float64)
    if a.numel() == 0:
        return Error(relative_l2=0.0, max_abs=0.0)
    if not bool(torch.isfinite(a).all()):
        return Error(relative_l2=math.inf, max_abs=math.inf)
    diff = (a - e).norm().item()
    norm = e.norm().item()
    rel = diff / norm if norm > 0 else (0.0 if diff == 0 else math.inf)
    return Error(relative_l2=rel, max_abs=(a - e).abs().max().item())


def assert_close(actual: torch.Tensor | None, expected: torch.Tensor, tolerance: float, what: str = "") -> Error:
    """The one test helper: fails with max-abs and relative error, and on any NaN."""
    err = error_of(actual, expected)
    assert err.is_within(tolerance), (
        f"{what}: relative L2 error {err.relative_l2:.3e} > {tolerance:.1e} (max abs {err.max_abs:.3e})")
    return err
