"""One answer judged against one server's greedy answer to the same prompt, under validate's rules (metrics.py):
tokens compared up to the first difference, a difference at the reference's near-tie forgiven when the answer moved
the reference's token like noise, and the mean logprob drift before it within the limit. Used where answers come
one at a time (the chaos bench, the lease probes) rather than as a dataset."""

from __future__ import annotations

from hybridserve.core.deployments.client import Completion
from hybridserve.core.validate.dataset import AnswerKind, Example
from hybridserve.core.validate.metrics import compare
from hybridserve.core.validate.thresholds import Thresholds

_NO_ANSWER = Example(prompt="", answer=None, answer_kind=AnswerKind.NONE)


def wrong_reason(reference: Completion, answer: Completion, thresholds: Thresholds) -> str | None:
    """Why `answer` is not the reference's answer (None: it is, within noise). An answer without logprobs can only
    match token for token."""
    tolerance = thresholds.near_tie_tolerance
    found = compare(0, _NO_ANSWER, reference, answer, tolerance, tolerance)
    return found.regression(thresholds.max_logprob_drift)
