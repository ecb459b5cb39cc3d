"""Measures `hybridserve plan` (`make bench-plan`); feeds BENCHMARKS.md, "plan".

The whole plan grid (9 models x TP 1/2/4/8 x 3 prompt lengths) from cold processes.

Run it with the interpreter of a base-only install (no torch, nixl or vllm), e.g. `make bench-plan`
(`.venv-plan/bin/python benchmarks/plan_grid.py`).
Prints a table: wall time of each cold `hybridserve plan` process (median of --repeat runs).
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import statistics
import subprocess
import sys
import time

MODELS = ["qwen3.5-397b-a17b", "qwen3.5-122b-a10b", "qwen3.5-35b-a3b", "qwen3.5-27b", "qwen3.5-9b", "qwen3.5-4b",
          "qwen3.5-2b", "qwen3.5-0.8b", "qwen3-next-80b-a3b"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    absent = [m for m in ("torch", "nixl", "vllm") if importlib.util.find_spec(m) is None]
    exe = shutil.which("hybridserve", path=str(__import__("pathlib").Path(sys.executable).parent))
    cmd = [exe, "plan", "--json", "--memory", "h200"]
    for m in MODELS:
        cmd += ["-m", m]
    for tp in (1, 2, 4, 8):
        cmd += ["--tp", str(tp)]
    for n in (1024, 8192, 32768):
        cmd += ["--prompt-len", str(n)]
    times = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        times.append(time.perf_counter() - start)
    import json

    plans = json.loads(out)
    print(f"python {sys.version.split()[0]}; not installed: {', '.join(absent) or 'none'}")
    print("| grid | plans | rows | cold runs | median s | min s | max s |")
    print("|---|---|---|---|---|---|---|")
    rows = sum(len(p["requests"]) for p in plans)
    print(f"| 9 models x TP 1/2/4/8 x 3 lengths | {len(plans)} | {rows} | {len(times)} | "
          f"{statistics.median(times):.3f} | {min(times):.3f} | {max(times):.3f} |")


if __name__ == "__main__":
    main()
