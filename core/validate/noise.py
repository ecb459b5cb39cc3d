"""The near-tie tolerance, measured: how much two clean runs of the same prompts move the top-2 margin.

A candidate's greedy token differs from the baseline's when, at that position, noise moved the candidate's margin
between the baseline's best token t1 and its runner-up t2 (logprob(t1) - logprob(t2), the top-2 gap) below zero.
So the noise that matters is the change of that margin from one clean computation to another, at positions where
both still chose the same token (before their first difference: after it their contexts differ). It is measured
between the baseline and a reference: a second clean run (the same server with the prompts in reverse order, so
they meet other batches, or an identical server). The tolerance is the largest change seen, or the largest
baseline gap at which the two clean runs themselves diverged (a flip of that size happened), whichever is larger:
a candidate divergence at a baseline gap below it is within what clean runs do; above it, it is not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hybridserve.core.common.errors import CouldNotRunError
from hybridserve.core.deployments.client import Completion
from hybridserve.core.validate.metrics import first_divergence


@dataclass(frozen=True, kw_only=True)
class Noise:
    """Two clean runs compared; the source of the near-tie tolerance."""

    reference: str  # what the baseline was compared with
    num_prompts: int
    num_positions: int  # positions where both chose the same token and both have the baseline's top-2 in their top-k
    max_margin_change: float  # largest |change of the top-2 margin| at those positions
    mean_margin_change: float
    max_logprob_drift: float  # largest |change of the chosen token's logprob| at the positions compared
    mean_logprob_drift: float
    divergence_gaps: tuple[float | None, ...]  # the baseline's top-2 gap where the two clean runs diverged

    @property
    def tolerance(self) -> float:
        return max([self.max_margin_change, *(g for g in self.divergence_gaps if g is not None)])


def _runner_up(top: dict[str, float], best: str) -> str | None:
    others = [(lp, tok) for tok, lp in top.items() if tok != best]
    return max(others)[1] if others else None


def margin_changes(base: Completion, other: Completion) -> tuple[list[float], list[float]]:
    """(|margin change|, |logprob change|) per position before the first difference of the two runs."""
    end = first_divergence(base, other)
    end = len(base.tokens) if end is None else end
    margins, drifts = [], []
    for position in range(min(end, len(base.top), len(other.top))):
        best = base.tokens[position]
        drifts.append(abs(base.logprobs[position] - other.logprobs[position]))
        second = _runner_up(base.top[position], best)
        mine, theirs = base.top[position], other.top[position]
        if second is None or best not in theirs or second not in theirs:
            continue
        margins.append(abs((theirs[best] - theirs[second]) - (mine[best] - mine[second])))
    return margins, drifts


def measure(reference: str, base: Sequence[Completion], other: Sequence[Completion]) -> Noise:
    margins, drifts, gaps = [], [], []
    for b, o in zip(base, other):
        if o.error is not None:
            raise CouldNotRunError(f"reference {reference}: a prompt failed ({o.error}); the noise needs clean runs")
        m, d = margin_changes(b, o)
        margins += m
        drifts += d
        where = first_divergence(b, o)
        if where is not None:
            gaps.append(b.top2_gaps[where] if where < len(b.top2_gaps) else None)
    if not margins:
        raise CouldNotRunError(f"reference {reference}: no position where both runs agree and the top-2 are known "
                               "(ask for more tokens or top logprobs)")
    return Noise(reference=reference, num_prompts=len(base), num_positions=len(margins),
                 max_margin_change=max(margins), mean_margin_change=sum(margins) / len(margins),
                 max_logprob_drift=max(drifts), mean_logprob_drift=sum(drifts) / len(drifts),
                 divergence_gaps=tuple(gaps))
