"""Rendering of a validation report: a rich table for people, a dict for `--json`."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from hybridserve.core.validate.run import ValidationReport


def _fmt(value: float | None, digits: int = 4, *, missing: str = "-") -> str:
    return missing if value is None else f"{value:.{digits}g}"


def render(console: Console, report: ValidationReport) -> None:
    metrics, verdict = report.verdict.metrics, report.verdict
    head = Table(title=f"validate: {report.dataset}, {metrics.num_prompts} prompts", show_header=True)
    head.add_column("")
    head.add_column("target")
    head.add_column("url")
    head.add_column("scheduler (from log)")
    head.add_column("time s", justify="right")
    for name, run in (("baseline", report.baseline), ("candidate", report.candidate)):
        schedulers = ", ".join(f"{k}: {v}" for k, v in run.schedulers.items()) or "-"
        head.add_row(name, run.label, run.url, schedulers, f"{run.elapsed_s:.1f}")
    console.print(head)
    table = Table(show_header=True)
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_column("limit", justify="right")
    table.add_column("")
    checks = {c.metric: c for c in verdict.checks}
    rows = [
        ("baseline_accuracy", metrics.baseline_accuracy), ("candidate_accuracy", metrics.candidate_accuracy),
        ("accuracy_drop", metrics.accuracy_drop), ("token_agreement", metrics.token_agreement),
        ("mean_logprob_drift", metrics.mean_logprob_drift),
    ]
    for name, value in rows:
        check = checks.get(name)
        limit = "-" if check is None else f"{'<=' if check.is_upper_limit else '>='} {check.limit:g}"
        state = "" if check is None else ("[green]ok[/]" if check.passed else "[bold red]FAILED[/]")
        table.add_row(name, _fmt(value, missing="-" if check is None else "not measured"), limit, state)
    failed = checks["failed_requests"]
    table.add_row("failed requests (candidate)", str(metrics.num_failed_requests), f"<= {failed.limit:g}",
                  "[green]ok[/]" if failed.passed else "[bold red]FAILED[/]")
    table.add_row("divergent prompts (not near-ties)", str(metrics.num_divergent_prompts), "", "")
    table.add_row("near-tie divergences (forgiven)", str(metrics.num_near_tie_prompts), "", "")
    positions = metrics.divergence_positions
    where = "-" if not positions else f"{list(positions[:12])}{' ...' if len(positions) > 12 else ''}"
    table.add_row("first-divergence token positions", where, "", "")
    console.print(table)
    color = "green" if verdict.passed else "bold red"
    console.print(f"[{color}]{verdict.summary}[/]", highlight=False)


def report_dict(report: ValidationReport) -> dict[str, Any]:
    metrics, verdict = report.verdict.metrics, report.verdict
    return {
        "dataset": report.dataset,
        "passed": verdict.passed,
        "summary": verdict.summary,
        "failed_metrics": [c.metric for c in verdict.failures],
        "checks": [{"metric": c.metric, "value": c.value, "limit": c.limit, "passed": c.passed,
                    "is_upper_limit": c.is_upper_limit} for c in verdict.checks],
        "metrics": {
            "num_prompts": metrics.num_prompts, "num_graded": metrics.num_graded,
            "baseline_accuracy": metrics.baseline_accuracy, "candidate_accuracy": metrics.candidate_accuracy,
            "accuracy_drop": metrics.accuracy_drop, "token_agreement": metrics.token_agreement,
            "num_divergent_prompts": metrics.num_divergent_prompts,
            "num_near_tie_prompts": metrics.num_near_tie_prompts,
            "divergence_positions": list(metrics.divergence_positions),
            "mean_logprob_drift": metrics.mean_logprob_drift,
            "num_failed_requests": metrics.num_failed_requests,
        },
        "thresholds": vars(verdict.thresholds),
        "targets": {name: {"label": run.label, "url": run.url, "run_dir": str(run.run_dir) if run.run_dir else None,
                           "schedulers": run.schedulers, "elapsed_s": run.elapsed_s}
                    for name, run in (("baseline", report.baseline), ("candidate", report.candidate))},
        "elapsed_s": report.elapsed_s,
    }
