"""Judge recorded validate runs again under each near-tie rule, from their evidence (`validate --save-completions`).
Feeds BENCHMARKS.md, "Async scheduling, H200" (the rule table).

    python3 benchmarks/rejudge_validate.py benchmarks/results/h200/async/validate_evidence.tgz

Each run's own thresholds (its measured tolerance and drift limit, from its validate JSON) are kept; only the bound
on the divergence drift (the candidate's move of the baseline's token at the first difference) changes: none (the
gap alone, as before), the per-position drift limit, or the near-tie tolerance (what validate uses).
"""

from __future__ import annotations

import json
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hybridserve.core.validate.dataset import AnswerKind, Example  # noqa: E402
from hybridserve.core.validate.evidence import load_completions  # noqa: E402
from hybridserve.core.validate.metrics import compare, summarize  # noqa: E402
from hybridserve.core.validate.thresholds import Thresholds  # noqa: E402
from hybridserve.core.validate.verdict import judge  # noqa: E402

RULES = {"gap alone": lambda t: None, "drift limit": lambda t: t.max_logprob_drift,
         "tolerance": lambda t: t.near_tie_tolerance}


def rejudge(folder: Path) -> list[dict]:
    rows = []
    example = Example(prompt=(0,), answer=None, answer_kind=AnswerKind.NONE)
    for evidence in sorted(folder.glob("evidence_*.json")):
        tag = evidence.stem.removeprefix("evidence_")
        report = json.loads((folder / f"validate_{tag}.json").read_text())
        limits = Thresholds(**report["thresholds"])
        base, cand = load_completions(evidence, "baseline"), load_completions(evidence, "candidate")
        row = {"run": tag, "as_run": report["passed"]}
        for name, bound in RULES.items():
            comps = [compare(i, example, b, c, limits.near_tie_tolerance, bound(limits))
                     for i, (b, c) in enumerate(zip(base, cand))]
            row[name] = judge(summarize(comps), limits, comps).passed
        rows.append(row)
    return rows


def main() -> None:
    source = Path(sys.argv[1])
    with tempfile.TemporaryDirectory() as tmp:
        folder = source
        if source.is_file():
            with tarfile.open(source) as archive:
                archive.extractall(tmp, filter="data")
            folder = Path(tmp)
        rows = rejudge(folder)
    print(f"{'run':36} {'as run':7} " + " ".join(f"{n:12}" for n in RULES))
    for row in rows:
        print(f"{row['run']:36} {'pass' if row['as_run'] else 'FAIL':7} "
              + " ".join(f"{'pass' if row[n] else 'FAIL':12}" for n in RULES))
    for name in RULES:
        clean = [r[name] for r in rows if "_none_" in r["run"]]
        faults = [not r[name] for r in rows if "_none_" not in r["run"]]
        print(f"{name}: clean runs passed {sum(clean)} of {len(clean)}, fault runs failed {sum(faults)} of {len(faults)}")


if __name__ == "__main__":
    main()
