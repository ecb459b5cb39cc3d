"""Fit a step profile's coefficients (step_profile.py) to what bench measured, in pure Python.

Two kinds of observation, each a sum of engine steps whose features are known:
- an idle request's TTFT at prompt length L: `http_s` plus the steps of its prefill, in chunks of the token budget
  (chunk k: n_k tokens after c_k, one request);
- the median TPOT of b requests sent at once with prompts of c tokens and o output tokens: one decode step of b
  requests, each at a context of about c + o / 2.
Least squares on relative error (each row divided by its value), every coefficient at least 0 (a negative one is
dropped and the rest fitted again: Lawson and Hanson's active set, in its simplest form).
The transfer's coefficients come from P/D's first inter-token gap at idle (token 1 from prefill, token 2 from
decode): the proxy's hop, decode's READ and one decode step; the READ is what is left once the other two are taken
off, fitted to the layout's merged descriptors and bytes at each length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hybridserve.core.sizing.step_profile import StepCoefficients, TransferCost

FEATURES = ("http_s", "base_s", "token_s", "seq_s", "attention_s")


@dataclass(frozen=True, kw_only=True)
class Observation:
    what: str  # "ttft 1024" or "itl b8 c512"
    features: tuple[float, ...]  # in FEATURES order
    value_s: float


def _pairs(n: int, before: int) -> float:
    return n * before + n * (n + 1) / 2


def ttft_observation(prompt_tokens: int, budget: int, ttft_s: float) -> Observation:
    features = [1.0, 0.0, 0.0, 0.0, 0.0]
    done = 0
    while done < prompt_tokens:
        n = min(budget, prompt_tokens - done)
        features[1:] = [features[1] + 1, features[2] + n, features[3] + 1, features[4] + _pairs(n, done)]
        done += n
    return Observation(what=f"ttft {prompt_tokens}", features=tuple(features), value_s=ttft_s)


def itl_observation(batch: int, prompt_tokens: int, output_tokens: int, itl_s: float) -> Observation:
    context = prompt_tokens + output_tokens / 2
    return Observation(what=f"itl b{batch} c{prompt_tokens}", features=(0.0, 1.0, batch, batch, batch * (context + 1)),
                       value_s=itl_s)


def nonnegative_least_squares(rows: Sequence[Sequence[float]], values: Sequence[float]) -> list[float]:
    """argmin ||A x - b|| with x >= 0 (relative rows: the caller divides each row by its value)."""
    width = len(rows[0])
    active = [j for j in range(width) if any(abs(r[j]) > 0 for r in rows)]
    while True:
        solution = _least_squares([[r[j] for j in active] for r in rows], values)
        x = [0.0] * width
        for j, value in zip(active, solution):
            x[j] = value
        negative = [j for j in active if x[j] < 0]
        if not negative:
            return x
        active.remove(min(negative, key=lambda j: x[j]))


def _least_squares(rows: Sequence[Sequence[float]], values: Sequence[float]) -> list[float]:
    """Normal equations, Gaussian elimination with partial pivoting (a tiny ridge keeps them solvable)."""
    n = len(rows[0]) if rows else 0
    if n == 0:
        return []
    scale = [max(abs(r[j]) for r in rows) or 1.0 for j in range(n)]
    a = [[sum(r[i] / scale[i] * r[j] / scale[j] for r in rows) + (1e-12 if i == j else 0.0) for j in range(n)]
         for i in range(n)]
    b = [sum(r[i] / scale[i] * v for r, v in zip(rows, values)) for i in range(n)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda k: abs(a[k][col]))
        a[col], a[pivot], b[col], b[pivot] = a[pivot], a[col], b[pivot], b[col]
        for k in range(col + 1, n):
            f = a[k][col] / a[col][col]
            a[k] = [x - f * y for x, y in zip(a[k], a[col])]
            b[k] -= f * b[col]
    x = [0.0] * n
    for i in reversed(range(n)):
        x[i] = (b[i] - sum(a[i][j] * x[j] for j in range(i + 1, n))) / a[i][i]
    return [xi / s for xi, s in zip(x, scale)]


def fit_steps(observations: Sequence[Observation]) -> tuple[StepCoefficients, list[dict]]:
    """The coefficients, and each observation beside what they predict (the fit's residuals, for the record)."""
    rows = [[f / o.value_s for f in o.features] for o in observations]
    x = nonnegative_least_squares(rows, [1.0] * len(observations))
    coefficients = StepCoefficients(**dict(zip(FEATURES, x)))
    report = [{"what": o.what, "measured_s": round(o.value_s, 6),
               "fitted_s": round(sum(f * c for f, c in zip(o.features, x)), 6)} for o in observations]
    return coefficients, report


def fit_transfer(rows: Sequence[tuple[float, float, float]]) -> TransferCost:
    """`rows`: (merged descriptors, bytes, READ seconds) per measured length."""
    features = [(1.0, d, b) for d, b, _ in rows]
    relative = [[f / max(s, 1e-9) for f in fs] for fs, (_, _, s) in zip(features, rows)]
    post, per_descriptor, per_byte = nonnegative_least_squares(relative, [1.0] * len(rows))
    return TransferCost(post_s=post, descriptor_s=per_descriptor, bytes_per_s=1 / per_byte if per_byte > 0 else 1e15)
