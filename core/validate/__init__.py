"""Validation of a candidate deployment against a baseline: datasets, metrics, verdict, thresholds, JUnit (the
deployments themselves: core/deployments)."""

from hybridserve.core.deployments.target import Config, Target, parse_target
from hybridserve.core.validate.dataset import Dataset, Example, load_dataset
from hybridserve.core.validate.thresholds import Thresholds, resolve as resolve_thresholds
from hybridserve.core.validate.validation import ValidateRequest, ValidationReport, validate
from hybridserve.core.validate.verdict import Verdict, judge

__all__ = [
    "Config", "Dataset", "Example", "Target", "Thresholds", "ValidateRequest", "ValidationReport", "Verdict",
    "judge", "load_dataset", "parse_target", "resolve_thresholds", "validate",
]
