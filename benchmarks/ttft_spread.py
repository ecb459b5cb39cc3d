"""How far an idle TTFT ratio can be trusted (BENCHMARKS.md, "Served on the H200, as users serve"): the ratio of
two targets' median TTFT at each prompt length, with a bootstrap interval, from the per-request records that
`hybridserve bench --json` wrote (served_h200.py's idle phase: bench_idle_<tokens>_<target>.json, in a folder or in
its raw.tgz).

    python3 benchmarks/ttft_spread.py benchmarks/results/h200/idle-2026-12-05/raw.tgz --pairs pd/single single-b/single

The interval is core/bench/median_ratio.py's: each target's TTFTs resampled --resamples times (seeded), the
ratio of the resampled medians' 2.5-97.5 % range. An A/A pair (two copies of one configuration) beside each
P/D pair shows the spread that no difference between configurations explains.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tarfile
from pathlib import Path

from hybridserve.core.bench.median_ratio import median_ratio_interval

NAME = re.compile(r"bench_idle_(\d+)_([\w.-]+)\.json$")


def read_records(source: Path) -> dict[int, dict[str, list[float]]]:
    """prompt tokens -> target -> the TTFTs (s) of its requests (probes left out)."""
    files: dict[str, bytes] = {}
    if source.is_dir():
        files = {p.name: p.read_bytes() for p in source.iterdir() if NAME.search(p.name)}
    else:
        with tarfile.open(source) as tar:
            for member in tar.getmembers():
                if NAME.search(member.name) and (f := tar.extractfile(member)) is not None:
                    files[Path(member.name).name] = f.read()
    out: dict[int, dict[str, list[float]]] = {}
    for name, data in files.items():
        m = NAME.search(name)
        bench = json.loads(data)
        records = bench["targets"][0]["phases"][0]["records"]
        out.setdefault(int(m.group(1)), {})[m.group(2)] = [r["ttft_s"] for r in records
                                                            if not r.get("is_probe") and r.get("ttft_s") is not None]
    return out


def spread(num: list[float], den: list[float], *, resamples: int, seed: int) -> tuple[float, float, float]:
    """The ratio of the medians, and its bootstrap 2.5 % and 97.5 % points."""
    low, high = median_ratio_interval(num, den, resamples=resamples, seed=seed)
    return statistics.median(num) / statistics.median(den), low, high


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="a folder of bench_idle_*.json, or the raw.tgz holding them")
    parser.add_argument("--pairs", nargs="+", default=["pd/single", "single-b/single"], metavar="NUM/DEN")
    parser.add_argument("--resamples", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    args = parser.parse_args()
    if not args.source.exists():
        print(f"error: {args.source}: no such folder or file (accepted: a folder of bench_idle_*.json, or a .tgz)",
              file=sys.stderr)
        return 2
    pairs = [tuple(p.split("/", 1)) for p in args.pairs if "/" in p]
    if len(pairs) != len(args.pairs) or args.resamples < 100:
        print(f"error: --pairs {' '.join(args.pairs)} / --resamples {args.resamples}: accepted NUM/DEN target "
              "names, and at least 100 resamples", file=sys.stderr)
        return 2
    records = read_records(args.source)
    rows = []
    for tokens in sorted(records):
        for num, den in pairs:
            if num in records[tokens] and den in records[tokens]:
                a, b = records[tokens][num], records[tokens][den]
                ratio, low, high = spread(a, b, resamples=args.resamples, seed=args.seed)
                rows.append({"tokens": tokens, "pair": f"{num}/{den}", "requests": [len(a), len(b)],
                             "median_ms": [round(1000 * statistics.median(a), 1), round(1000 * statistics.median(b), 1)],
                             "ratio": round(ratio, 3), "low": round(low, 3), "high": round(high, 3)})
    if not rows:
        print(f"error: {args.source}: no bench_idle_<tokens>_<target>.json of the targets named", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"source": str(args.source), "resamples": args.resamples, "rows": rows}, indent=1))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"median TTFT ratio, {args.resamples} bootstrap resamples (2.5-97.5 %)")
    for column in ("prompt tokens", "pair", "requests", "medians ms", "ratio", "interval"):
        table.add_column(column, justify="right" if column != "pair" else "left")
    for r in rows:
        table.add_row(str(r["tokens"]), r["pair"], " / ".join(map(str, r["requests"])),
                      " / ".join(f"{m:.0f}" for m in r["median_ms"]), f"{r['ratio']:.2f}x",
                      f"{r['low']:.2f}-{r['high']:.2f}")
    Console().print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
