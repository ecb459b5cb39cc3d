"""Measures `hybridserve transfer bench --memory vram` under UCX settings, and the staged path; feeds
BENCHMARKS.md, "Staged path and UCX settings, H200".

On a CUDA host: NIXL VRAM->VRAM between two processes under several UCX settings, with UCX's own
protocol logs, and the staged path (VRAM -> DRAM -> NIXL -> DRAM -> VRAM) that kv_buffer_device=cpu uses.

  python3 benchmarks/transfer_ucx_settings.py --out $OUT
Each UCX variant runs `hybridserve transfer bench` in a fresh process (UCX reads its environment once) on
Qwen3.5-397B TP1->1 (bf16 SSM, FlashInfer), one 32k request (1.10 GB) per allocation, our scheme; the best
variant then runs both schemes at 1k/8k/32k. Writes results.json, ucx_logs.txt and summary.md under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

BASE = ["-m", "qwen3.5-397b-a17b", "--mamba-ssm-cache-dtype", "bfloat16", "--json"]
VARIANTS = {  # name -> environment changes (None: unset)
    "default": {"UCX_TLS": None},
    "cuda_ipc,cuda_copy,tcp": {"UCX_TLS": "cuda_ipc,cuda_copy,tcp"},
    "cuda_ipc,cuda_copy,sm": {"UCX_TLS": "cuda_ipc,cuda_copy,sm"},
    "^tcp": {"UCX_TLS": "^tcp"},
    "cuda_ipc,cuda_copy,tcp proto v1": {"UCX_TLS": "cuda_ipc,cuda_copy,tcp", "UCX_PROTO_ENABLE": "n"},
    "cuda_ipc alone": {"UCX_TLS": "cuda_ipc"},
}
KEEP = re.compile(r"cuda_ipc|cuda_copy|rma|get|zcopy|proto|error|fail|transport|tl|GB|UCX", re.I)


def bench(args: list[str], env_changes: dict[str, str | None], timeout_s: float) -> tuple[dict | None, str, float]:
    env = dict(os.environ, UCX_PROTO_INFO="y", UCX_LOG_LEVEL="info", NIXL_LOG_LEVEL="WARN")
    for key, value in env_changes.items():
        env.pop(key, None) if value is None else env.__setitem__(key, value)
    t0 = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-c", "from hybridserve.cli.app import main; main()", "transfer",
                               "bench", *BASE, *args],
                              capture_output=True, text=True, timeout=timeout_s, env=env)
        out, err = done.stdout, done.stderr
    except subprocess.TimeoutExpired as exc:
        out, err = "", f"TIMEOUT after {timeout_s}s\n{exc.stderr or ''}"
    return _json_block(out), out + "\n" + err, time.monotonic() - t0


def _json_block(out: str) -> dict | None:
    """The CLI's JSON, from stdout that UCX's own log lines (UCX logs to stdout) may surround."""
    lines = out.splitlines()
    try:
        start = lines.index("{")
        end = len(lines) - 1 - lines[::-1].index("}")
        return json.loads("\n".join(lines[start:end + 1]))
    except (ValueError, json.JSONDecodeError):
        return None


def staged(num_bytes: int) -> dict[str, float]:
    """D2H into pinned host memory and H2D back, in one process (what the staged path adds around NIXL)."""
    import torch

    dev = torch.empty(num_bytes, dtype=torch.uint8, device="cuda")
    host = torch.empty(num_bytes, dtype=torch.uint8, pin_memory=True)
    dev2 = torch.empty_like(dev)
    out = {}
    for name, fn in (("d2h", lambda: host.copy_(dev, non_blocking=True)),
                     ("h2d", lambda: dev.copy_(host, non_blocking=True)),
                     ("d2d", lambda: dev2.copy_(dev, non_blocking=True))):
        best = float("inf")
        for _ in range(5):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t0)
        out[f"{name}_s"], out[f"{name}_gbps"] = best, num_bytes / best / 1e9
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--timeout", type=float, default=90)
    parser.add_argument("--budget", type=float, default=480, help="seconds for everything; later steps skipped")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results, logs = {}, []
    sweep = ["--memory", "vram", "--prompt-len", "32768", "--scheme", "ours", "--requests", "1", "--timeout", "60"]
    start = time.monotonic()

    def save() -> None:
        (args.out / "results.json").write_text(json.dumps(results, indent=1, default=str))

    for name, env in VARIANTS.items():
        if time.monotonic() - start > args.budget * 0.6:
            results[name] = "skipped: out of time"
            continue
        result, err, wall = bench(sweep, env, args.timeout)
        best = max((r["gbps"] for r in result["rows"]), default=None) if result else None
        results[name] = {"env": env, "wall_s": wall, "best_gbps": best, "result": result}
        print(f"{name}: best {best} GB/s, {wall:.0f} s", flush=True)
        kept = [line for line in err.splitlines() if KEEP.search(line)]
        logs.append(f"===== {name} {env} best_gbps={best}\n" + "\n".join(kept[:150]) + "\n" + "\n".join(
            err.splitlines()[-15:]))
        (args.out / "ucx_logs.txt").write_text("\n".join(logs))
        save()
    results["staged"] = staged(1_104_322_560)
    save()
    ran = [n for n in VARIANTS if isinstance(results.get(n), dict) and results[n]["best_gbps"]]
    winner = max(ran, key=lambda n: results[n]["best_gbps"], default=None)
    full = ["--memory", "vram", "--prompt-len", "1024", "--prompt-len", "8192", "--prompt-len", "32768",
            "--requests", "2"]
    dram, err, _ = bench(["--memory", "dram", "--prompt-len", "32768", "--scheme", "ours", "--requests", "2"],
                         {"UCX_TLS": None}, args.timeout)
    results["dram"] = dram
    num_bytes = 1_104_322_560
    if dram:
        nixl_s = num_bytes / max(r["gbps"] for r in dram["rows"]) / 1e9
        s = results["staged"]
        results["staged"]["total_s"] = s["d2h_s"] + nixl_s + s["h2d_s"]
        results["staged"]["total_gbps"] = num_bytes / results["staged"]["total_s"] / 1e9
    save()
    left = args.budget - (time.monotonic() - start)
    if winner and left > 30:
        results["full:" + winner], _, _ = bench(full, VARIANTS[winner], left)
    save()
    print(json.dumps({k: (v.get("best_gbps") if isinstance(v, dict) and "best_gbps" in v else None)
                      for k, v in results.items()}), flush=True)
    print(json.dumps(results["staged"]), flush=True)


if __name__ == "__main__":
    main()
