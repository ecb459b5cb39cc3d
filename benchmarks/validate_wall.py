"""Measures `hybridserve validate`'s wall time; feeds BENCHMARKS.md, "validate wall time, CPU".

Wall time of `hybridserve validate` on CPU: start single-sync and pd-async, send 64 prompts to each, judge.

    .venv/bin/python benchmarks/validate_wall.py [--num-prompts 64] [--max-tokens 8] [--repeats 1]

Prints one row per run: total wall time, each phase (start + requests + stop), the span from the first to the
last answer of each phase (the request part), accuracy and the verdict. Model: validate's default (the trained
recall model, default limits). Goal (issue 6): under 3 minutes for 64 prompts.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from hybridserve.core.deployments.client import RequestSettings
from hybridserve.core.validate import ValidateRequest, load_dataset, parse_target, validate
from hybridserve.core.validate.thresholds import Thresholds


def one_run(num_prompts: int, max_tokens: int, seed: int, run_root: Path) -> dict:
    marks: dict[str, list[float]] = {}

    def on_progress(phase: str, done: int, _total: int) -> None:
        if done > 0:
            marks.setdefault(phase, []).append(time.monotonic())

    request = ValidateRequest(
        baseline=parse_target("single-sync", what="baseline"), candidate=parse_target("pd-async", what="candidate"),
        dataset=load_dataset("synthetic", num_prompts=num_prompts, seed=seed),
        settings=RequestSettings(max_tokens=max_tokens), thresholds=Thresholds(), base_port=9300, run_root=run_root, num_cores=os.cpu_count() or 1)
    start = time.monotonic()
    report = validate(request, on_progress)
    span = {phase: times[-1] - times[0] for phase, times in marks.items()}
    return {"total_s": time.monotonic() - start, "baseline_s": report.baseline.elapsed_s,
            "candidate_s": report.candidate.elapsed_s, "baseline_answers_s": span.get("baseline", 0.0),
            "candidate_answers_s": span.get("candidate", 0.0), "verdict": "pass" if report.verdict.passed else
            "regression", "agreement": report.verdict.metrics.token_agreement,
            "accuracy": (report.verdict.metrics.baseline_accuracy, report.verdict.metrics.candidate_accuracy)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--run-dir", type=Path, default=Path("runs/bench-validate"))
    args = parser.parse_args()
    table = Table(title=f"validate wall time: single-sync vs pd-async, {args.num_prompts} prompts x "
                        f"{args.max_tokens} tokens, trained recall model, CPU ({os.cpu_count()} cores)")
    for name in ("run", "total s", "baseline phase s", "candidate phase s", "baseline answers s",
                 "candidate answers s", "accuracy (base / cand)", "token agreement", "verdict"):
        table.add_column(name, justify="right")
    for i in range(args.repeats):
        row = one_run(args.num_prompts, args.max_tokens, seed=i, run_root=args.run_dir.resolve())
        table.add_row(str(i + 1), f"{row['total_s']:.1f}", f"{row['baseline_s']:.1f}", f"{row['candidate_s']:.1f}",
                      f"{row['baseline_answers_s']:.1f}", f"{row['candidate_answers_s']:.1f}",
                      "{:.3f} / {:.3f}".format(*row["accuracy"]), f"{row['agreement']:.3f}", row["verdict"])
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
