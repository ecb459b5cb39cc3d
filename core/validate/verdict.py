"""The verdict: each metric against its threshold; a failure names the metric, its value and the limit."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hybridserve.core.validate.metrics import Metrics, PromptComparison
from hybridserve.core.validate.thresholds import Thresholds


@dataclass(frozen=True, kw_only=True)
class Check:
    metric: str
    value: float | None  # None: nothing was measured
    limit: float
    is_upper_limit: bool  # True: value must be <= limit
    # True: a check that cannot be made fails (drift and agreement always exist unless something is badly wrong);
    # False: it is skipped (accuracy when no example has an answer)
    is_required: bool = False

    @property
    def passed(self) -> bool:
        if self.value is None:
            return not self.is_required
        return self.value <= self.limit if self.is_upper_limit else self.value >= self.limit

    @property
    def message(self) -> str:
        if self.value is None:
            return f"{self.metric}: not measured{': FAILED (the check needs it)' if self.is_required else ''}"
        sign = "<=" if self.is_upper_limit else ">="
        state = "ok" if self.passed else "FAILED"
        return f"{self.metric} {self.value:.4g} (must be {sign} {self.limit:g}): {state}"


@dataclass(frozen=True, kw_only=True)
class Verdict:
    metrics: Metrics
    thresholds: Thresholds
    checks: tuple[Check, ...]

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    @property
    def failures(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if not c.passed)

    @property
    def summary(self) -> str:
        if self.passed:
            return "pass: the candidate keeps the baseline's accuracy"
        return "regression: " + "; ".join(c.message for c in self.failures)


def prompt_regressions(comparisons: Sequence[PromptComparison], thresholds: Thresholds) -> tuple[str | None, ...]:
    """Per prompt: why it is a regression on its own, or None."""
    return tuple(c.regression(thresholds.max_logprob_drift) for c in comparisons)


def judge(metrics: Metrics, thresholds: Thresholds, comparisons: Sequence[PromptComparison] = ()) -> Verdict:
    checks = [
        Check(metric="accuracy_drop", value=metrics.accuracy_drop, limit=thresholds.max_accuracy_drop,
              is_upper_limit=True),
        Check(metric="token_agreement", value=metrics.token_agreement, limit=thresholds.min_token_agreement,
              is_upper_limit=False, is_required=True),
        Check(metric="mean_logprob_drift", value=metrics.mean_logprob_drift, limit=thresholds.max_logprob_drift,
              is_upper_limit=True, is_required=True),
    ]
    checks.append(Check(metric="failed_requests", value=float(metrics.num_failed_requests),
                        limit=thresholds.max_failed_requests, is_upper_limit=True))
    if thresholds.max_regressed_prompts is not None:
        regressed = sum(r is not None for r in prompt_regressions(comparisons, thresholds))
        checks.append(Check(metric="regressed_prompts", value=float(regressed),
                            limit=thresholds.max_regressed_prompts, is_upper_limit=True, is_required=True))
    if thresholds.min_candidate_accuracy is not None:
        checks.append(Check(metric="candidate_accuracy", value=metrics.candidate_accuracy,
                            limit=thresholds.min_candidate_accuracy, is_upper_limit=False))
    return Verdict(metrics=metrics, thresholds=thresholds, checks=tuple(checks))
