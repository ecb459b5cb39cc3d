"""A validation's evidence: every completion of each side, so a verdict can be judged again without re-running."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from hybridserve.core.common.atomic_file import write_text
from hybridserve.core.common.errors import InputError
from hybridserve.core.deployments.client import Completion


def completions_dict(report: Any) -> dict[str, Any]:  # a ValidationReport (run.py imports this module's users)
    return {"dataset": report.dataset, "near_tie_tolerance": report.verdict.thresholds.near_tie_tolerance,
            "max_logprob_drift": report.verdict.thresholds.max_logprob_drift,
            **{side: [asdict(c) for c in answers] for side, answers in (
                ("baseline", report.baseline_answers), ("reference", report.reference_answers),
                ("candidate", report.candidate_answers))}}


def load_completions(path: Path, side: str) -> tuple[Completion, ...]:
    try:
        raw = json.loads(Path(path).read_text())[side]
        return tuple(Completion(**{**c, "tokens": tuple(c["tokens"]), "logprobs": tuple(c["logprobs"]),
                                   "top2_gaps": tuple(c["top2_gaps"]), "top": tuple(c["top"])}) for c in raw)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"{path}: not a --save-completions file with a {side!r} side ({exc})") from None


def write_completions(path: Path, report: Any) -> None:
    """Written whole or not at all: a temporary file in the same folder, renamed."""
    path = Path(path)
    if not path.parent.is_dir():
        raise InputError(f"--save-completions {path}: no folder {path.parent}; accepted: a file in an existing folder")
    write_text(path, json.dumps(completions_dict(report)))
