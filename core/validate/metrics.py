"""Compare a candidate's greedy completions with a baseline's, prompt by prompt, and pool the numbers.

Token agreement mirrors how vLLM's own tests compare two greedy runs (tests/models/utils.py
check_logprobs_close): tokens are compared up to the first position where they differ; after it the two
continuations have different contexts, so nothing later is compared. A first difference where the baseline's
(the reference's) best and second-best tokens were within `near_tie_tolerance` (logprob gap) is bf16 noise, not
a regression: that prompt counts as agreeing in full. The candidate's own gap is not used: a corrupted state
often makes the candidate unsure, which must not excuse it.

A near-tie is forgiven only when the candidate itself moved like noise there: at the divergence both sides still
had the same context, so the candidate's logprob of the baseline's token is comparable, and its change from the
baseline's (the divergence drift) must stay within the near-tie tolerance, the largest move of a top-2 margin that
two clean runs showed. A flat model (random weights: every position a near-tie) otherwise forgives a corrupted GDN
state at its first token, because a state taken from another request moves the whole distribution and any small
gap flips; noise moves it by noise. Measured on the H200 (60 layers, benchmarks/HISTORY.md, "Async scheduling,
H200"): the gap alone forgave 4 of 18 fault runs; with this bound all 18 fail and all 6 clean runs pass. A bound at the
per-position drift limit (the largest single-token drift of the clean runs, 3 prompts) failed 2 of the 6 clean
runs: at 32k clean divergences moved the token by 0.084 and 0.123 against a limit of 0.077.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from hybridserve.core.deployments.client import Completion
from hybridserve.core.validate.dataset import Example, is_correct


@dataclass(frozen=True, kw_only=True)
class PromptComparison:
    index: int
    is_baseline_correct: bool | None  # None: the example has no answer
    is_candidate_correct: bool | None
    num_tokens: int  # the baseline's generated tokens
    first_divergence: int | None  # token position of the first difference; None: identical
    is_near_tie: bool  # the first difference was a near-tie (forgiven)
    num_compared: int  # positions compared for drift (before the first difference)
    sum_abs_logprob_drift: float  # over those positions
    is_candidate_failed: bool = False  # the candidate refused the prompt (e.g. HTTP 400 on NaN logprobs)
    divergence_gap: float | None = None  # the baseline's top-2 logprob gap at the first difference
    # |baseline - candidate| logprob of the baseline's first token (the candidate's from its top-k when it chose
    # another); None: not in the candidate's top-k, or nothing generated
    first_token_drift: float | None = None
    num_prompt_tokens: int | None = None  # token-id prompts (the random dataset)
    # |baseline - candidate| logprob of the baseline's token at the first difference (same context on both sides);
    # a lower bound when that token fell out of the candidate's top-k; None: no difference, or no top-k to tell
    divergence_drift: float | None = None

    @property
    def mean_logprob_drift(self) -> float | None:
        return self.sum_abs_logprob_drift / self.num_compared if self.num_compared else None

    def regression(self, max_logprob_drift: float) -> str | None:
        """Why this prompt alone is a regression (None: it is not): refused, a divergence that is not a near-tie,
        or a mean drift over the limit before its first difference."""
        if self.is_candidate_failed:
            return "candidate refused it"
        if self.first_divergence is not None and not self.is_near_tie:
            return (f"diverged at token {self.first_divergence} (baseline top-2 gap {_text(self.divergence_gap)}, "
                    f"the candidate moved the baseline's token by {_text(self.divergence_drift)})")
        drift = self.mean_logprob_drift
        if drift is not None and drift > max_logprob_drift:
            return f"mean logprob drift {drift:.4g} > {max_logprob_drift:g}"
        return None

    @property
    def num_agreed_tokens(self) -> int:
        if self.first_divergence is None or self.is_near_tie:
            return self.num_tokens
        return min(self.first_divergence, self.num_tokens)


def _text(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.4g}"


def _gap_at(completion: Completion, position: int) -> float | None:
    return completion.top2_gaps[position] if position < len(completion.top2_gaps) else None


def first_divergence(base: Completion, cand: Completion) -> int | None:
    for position, (a, b) in enumerate(zip(base.tokens, cand.tokens)):
        if a != b:
            return position
    if len(base.tokens) != len(cand.tokens):
        return min(len(base.tokens), len(cand.tokens))
    return None


def drift_at(base: Completion, cand: Completion, position: int) -> float | None:
    """|baseline - candidate| logprob of the baseline's token at `position` (from the candidate's top-k); when the
    candidate's top-k lacks it, at least the distance to the candidate's k-th logprob."""
    if position >= len(base.tokens) or position >= len(cand.top) or not cand.top[position]:
        return None
    token, mine, theirs = base.tokens[position], base.logprobs[position], cand.top[position]
    if token in theirs:
        return abs(mine - theirs[token])
    return max(0.0, mine - min(theirs.values()))


def first_token_drift(base: Completion, cand: Completion) -> float | None:
    if not base.tokens or not cand.tokens:
        return None
    token = base.tokens[0]
    other = cand.logprobs[0] if cand.tokens[0] == token else (cand.top[0].get(token) if cand.top else None)
    return None if other is None else abs(base.logprobs[0] - other)


def compare(index: int, example: Example, base: Completion, cand: Completion,
            near_tie_tolerance: float, max_divergence_drift: float | None = None) -> PromptComparison:
    """`max_divergence_drift`: a near-tie is forgiven only when the divergence drift is within it (None: the gap
    alone decides, as before the rule)."""
    num_prompt_tokens = None if isinstance(example.prompt, str) else len(example.prompt)
    if cand.error is not None:
        graded = is_correct(example, base.text)
        return PromptComparison(index=index, is_baseline_correct=graded,
                                is_candidate_correct=None if graded is None else False,
                                num_tokens=len(base.tokens), first_divergence=0, is_near_tie=False, num_compared=0,
                                sum_abs_logprob_drift=0.0, is_candidate_failed=True,
                                num_prompt_tokens=num_prompt_tokens)
    where = first_divergence(base, cand)
    gap = None if where is None else _gap_at(base, where)
    num_compared = len(base.tokens) if where is None else where
    drift = sum(abs(a - b) for a, b in zip(base.logprobs[:num_compared], cand.logprobs[:num_compared]))
    at = None if where is None else drift_at(base, cand, where)
    # an answer that ends where the other still has a token was not flipped by noise (issue 39: 1 token of 16, a
    # READ of blocks prefill had reused); only two tokens chosen from the same context can be a near-tie
    is_cut = where is not None and where >= min(len(base.tokens), len(cand.tokens))
    is_near_tie = not is_cut and gap is not None and gap < near_tie_tolerance and (
        max_divergence_drift is None or at is None or at <= max_divergence_drift)
    return PromptComparison(
        index=index, is_baseline_correct=is_correct(example, base.text),
        is_candidate_correct=is_correct(example, cand.text), num_tokens=len(base.tokens),
        first_divergence=where, is_near_tie=is_near_tie, divergence_drift=at,
        num_compared=num_compared, sum_abs_logprob_drift=drift, divergence_gap=gap,
        first_token_drift=first_token_drift(base, cand), num_prompt_tokens=num_prompt_tokens,
    )


@dataclass(frozen=True, kw_only=True)
class Metrics:
    num_prompts: int
    num_graded: int
    baseline_accuracy: float | None  # None: no example has an answer
    candidate_accuracy: float | None
    token_agreement: float | None  # agreed tokens / baseline tokens, near-ties forgiven; None: no tokens at all
    num_divergent_prompts: int  # first difference is not a near-tie
    num_near_tie_prompts: int
    divergence_positions: tuple[int, ...]  # first-difference positions of the divergent prompts, sorted
    # mean |baseline - candidate| logprob of the same token, before any difference; None: not one token was
    # compared (every prompt diverged at token 0, or the candidate refused them all), so nothing was measured
    mean_logprob_drift: float | None
    num_failed_requests: int = 0  # prompts the candidate refused (they count as wrong and divergent at 0)
    mean_first_token_drift: float | None = None  # over the prompts where it was measured
    max_first_token_drift: float | None = None

    @property
    def near_tie_share(self) -> float | None:
        """Near-tie divergences / all divergences (None: no prompt diverged)."""
        num = self.num_near_tie_prompts + self.num_divergent_prompts
        return self.num_near_tie_prompts / num if num else None

    @property
    def accuracy_drop(self) -> float | None:
        if self.baseline_accuracy is None or self.candidate_accuracy is None:
            return None
        return self.baseline_accuracy - self.candidate_accuracy

    @property
    def median_divergence_position(self) -> float | None:
        return statistics.median(self.divergence_positions) if self.divergence_positions else None


def _accuracy(values: Sequence[bool | None]) -> float | None:
    graded = [v for v in values if v is not None]
    return sum(graded) / len(graded) if graded else None


def summarize(comparisons: Sequence[PromptComparison]) -> Metrics:
    divergent = [c for c in comparisons if c.first_divergence is not None and not c.is_near_tie]
    num_tokens = sum(c.num_tokens for c in comparisons)
    num_compared = sum(c.num_compared for c in comparisons)
    first = [c.first_token_drift for c in comparisons if c.first_token_drift is not None]
    return Metrics(
        num_prompts=len(comparisons),
        num_graded=sum(c.is_baseline_correct is not None for c in comparisons),
        baseline_accuracy=_accuracy([c.is_baseline_correct for c in comparisons]),
        candidate_accuracy=_accuracy([c.is_candidate_correct for c in comparisons]),
        token_agreement=sum(c.num_agreed_tokens for c in comparisons) / num_tokens if num_tokens else None,
        num_divergent_prompts=len(divergent),
        num_near_tie_prompts=sum(c.first_divergence is not None and c.is_near_tie for c in comparisons),
        divergence_positions=tuple(sorted(c.first_divergence for c in divergent if c.first_divergence is not None)),
        mean_logprob_drift=sum(c.sum_abs_logprob_drift for c in comparisons) / num_compared if num_compared else None,
        num_failed_requests=sum(c.is_candidate_failed for c in comparisons),
        mean_first_token_drift=sum(first) / len(first) if first else None, max_first_token_drift=max(first, default=None),
    )
