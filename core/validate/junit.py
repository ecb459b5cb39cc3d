"""A JUnit XML report of a verdict: one test case per check, so CI shows which metric failed."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from hybridserve.core.common.atomic_file import write_bytes
from hybridserve.core.common.errors import InputError
from hybridserve.core.validate.verdict import Verdict


def to_xml(verdict: Verdict, *, suite_name: str, elapsed_s: float) -> bytes:
    failures = verdict.failures
    suite = ET.Element("testsuite", name=suite_name, tests=str(len(verdict.checks)),
                       failures=str(len(failures)), errors="0", time=f"{elapsed_s:.3f}")
    properties = ET.SubElement(suite, "properties")
    metrics = verdict.metrics
    for name in ("num_prompts", "baseline_accuracy", "candidate_accuracy", "token_agreement",
                 "num_divergent_prompts", "num_near_tie_prompts", "mean_logprob_drift", "num_failed_requests"):
        ET.SubElement(properties, "property", name=name, value=str(getattr(metrics, name)))
    for check in verdict.checks:
        case = ET.SubElement(suite, "testcase", classname=suite_name, name=check.metric)
        if not check.passed:
            ET.SubElement(case, "failure", message=check.message, type="regression").text = check.message
    ET.indent(suite)
    return ET.tostring(suite, encoding="utf-8", xml_declaration=True) + b"\n"


def write_junit(path: Path, verdict: Verdict, *, suite_name: str, elapsed_s: float) -> None:
    """Write atomically: a temporary file in the same folder, then rename (nothing half-written)."""
    data = to_xml(verdict, suite_name=suite_name, elapsed_s=elapsed_s)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise InputError(f"--junit {path}: folder {folder} does not exist")
    write_bytes(path, data)
