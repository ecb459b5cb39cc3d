"""Rendering of a validation report: a rich table for people, a dict for `--json`."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from hybridserve.core.validate.validation import ValidationReport


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
    table.add_row("near-tie share of divergences", _fmt(metrics.near_tie_share), "", "")
    table.add_row("first-token logprob drift mean / max", f"{_fmt(metrics.mean_first_token_drift)} / "
                  f"{_fmt(metrics.max_first_token_drift)}", "", "")
    source = "measured" if report.noise is not None else "given"
    table.add_row("near-tie tolerance (top-2 gap)", f"{verdict.thresholds.near_tie_tolerance:.4g}", source, "")
    table.add_row("per-prompt drift limit", f"{verdict.thresholds.max_logprob_drift:.4g}", source, "")
    console.print(table)
    if report.noise is not None:
        n = report.noise
        console.print(f"noise (baseline vs {n.reference}, {n.num_positions} positions of {n.num_prompts} prompts): "
                      f"top-2 margin change max {n.max_margin_change:.4g}, mean {n.mean_margin_change:.4g}; logprob "
                      f"drift max {n.max_logprob_drift:.4g}; clean divergences {len(n.divergence_gaps)}", highlight=False)
    if any(c.num_prompt_tokens is not None for c in report.comparisons):
        console.print(_prompt_table(report))
    color = "green" if verdict.passed else "bold red"
    console.print(f"[{color}]{verdict.summary}[/]", highlight=False)


def _prompt_table(report: ValidationReport) -> Table:
    table = Table(title="per prompt", show_header=True)
    for name in ("#", "tokens", "divergence", "base top-2 gap", "drift there", "near-tie", "first-token drift",
                 "mean drift", ""):
        table.add_column(name, justify="right" if name not in ("near-tie", "") else "left")
    for c, why in zip(report.comparisons, report.regressions):
        table.add_row(str(c.index), str(c.num_prompt_tokens), "-" if c.first_divergence is None else
                      str(c.first_divergence), _fmt(c.divergence_gap), _fmt(c.divergence_drift),
                      "yes" if c.is_near_tie else "-",
                      _fmt(c.first_token_drift), _fmt(c.mean_logprob_drift),
                      "[green]ok[/]" if why is None else f"[bold red]{why}[/]")
    return table


def prompt_dict(c, why: str | None) -> dict[str, Any]:  # noqa: ANN001
    return {"index": c.index, "prompt_tokens": c.num_prompt_tokens, "generated_tokens": c.num_tokens,
            "first_divergence": c.first_divergence, "divergence_top2_gap": c.divergence_gap,
            "is_near_tie": c.is_near_tie, "divergence_drift": c.divergence_drift,
            "first_token_drift": c.first_token_drift,
            "mean_logprob_drift": c.mean_logprob_drift, "is_candidate_failed": c.is_candidate_failed,
            "passed": why is None, "regression": why}


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
            "near_tie_share": metrics.near_tie_share,
            "mean_first_token_drift": metrics.mean_first_token_drift,
            "max_first_token_drift": metrics.max_first_token_drift,
        },
        "near_tie_tolerance": {"value": verdict.thresholds.near_tie_tolerance,
                               "source": "measured" if report.noise is not None else "given"},
        "max_logprob_drift": {"value": verdict.thresholds.max_logprob_drift,
                              "source": "measured" if report.noise is not None else "given"},
        "noise": None if report.noise is None else {**vars(report.noise), "tolerance": report.noise.tolerance,
                                                   "divergence_gaps": list(report.noise.divergence_gaps)},
        "prompts": [prompt_dict(c, why) for c, why in zip(report.comparisons, report.regressions)],
        "thresholds": vars(verdict.thresholds),
        "targets": {name: {"label": run.label, "url": run.url, "run_dir": str(run.run_dir) if run.run_dir else None,
                           "schedulers": run.schedulers, "elapsed_s": run.elapsed_s}
                    for name, run in (("baseline", report.baseline), ("candidate", report.candidate),
                                      ("reference", report.reference)) if run is not None},
        "elapsed_s": report.elapsed_s,
    }
