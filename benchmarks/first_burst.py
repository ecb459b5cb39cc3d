"""A fresh server's first burst against the same burst again, with and without launch's warm-up (issue 51, point 1).
Feeds BENCHMARKS.md, "The first burst after a start". Two steps, each one device call (benchmarks/h200.sh
first-burst-kernel, first-burst):

    python3 benchmarks/first_burst.py kernel --out $OUT
        FlashInfer's GDN prefill (vLLM 0.26's default on Hopper) in a fresh process, Qwen3.5-397B's TP1 GDN heads:
        each path's first call against its second, by wall time around a synchronize. vLLM's own warm-up runs one
        64-token sequence; a step of several sequences takes another path (gdn_prefill.py: context-parallel only
        while num_seqs x heads < SMs / 2), compiled on its first call into a cache that lives in the process.
    python3 benchmarks/first_burst.py served --role single|all --warmup on|off --out $OUT
        `launch` at its CUDA defaults (nothing but --model and --device cuda, and --no-warmup for off), then 32
        requests at once (prompts 500-12,000 tokens, 1-256 out: the first 32 of issue 51's load), then the same
        lengths again with new prompt ids (no prefix cache hit), then stop. Each burst's TTFT from bench's client;
        the files the caches gained during each burst (Triton, torch.compile, FlashInfer), which names a JIT
        compile that is kept on disk; one kept only in memory shows as a stall with no file.
    python3 benchmarks/first_burst.py served --cpu-smoke --role all --warmup on --out /tmp/fb   # here, the tiny model
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from served_h200 import CLI, client_numbers, run_json  # noqa: E402 (benchmarks/ beside this file)

M60 = "/tmp/m60"
CACHES = (os.environ.get("TRITON_CACHE_DIR", str(Path.home() / ".triton/cache")), str(Path.home() / ".cache/vllm"),
          str(Path.home() / ".cache/flashinfer"), "/tmp/torchinductor_root")
BURST = {"cuda": ["--input-len", "500:12000", "--output-len", "1:256", "--num-requests", "32", "--concurrency", "32"],
         "cpu": ["--input-len", "100:1500", "--output-len", "1:16", "--num-requests", "4", "--concurrency", "4"]}
# (sequence lengths of one call) in the order a fresh server meets them: vLLM's warm-up, an idle 1k and 8k request,
# then the first step of a burst (several prompts), then a step with more
KERNEL_CALLS = ((64,), (1024,), (8192,), (1024, 3000), (500, 2000, 4000, 1692), (16,) * 32)


def kernel(out: Path) -> dict:
    import torch
    from flashinfer.gdn_prefill import chunk_gated_delta_rule

    hk, hv, d = 16, 64, 128  # Qwen3.5-397B-A17B's GDN heads at TP1 (the 60-layer model's geometry)
    rows = []
    for lengths in KERNEL_CALLS:
        for attempt in ("first", "second"):
            total, n = sum(lengths), len(lengths)
            q, k = (torch.nn.functional.normalize(torch.randn(total, hk, d, device="cuda"), dim=-1).bfloat16()
                    for _ in range(2))
            v = torch.randn(total, hv, d, device="cuda", dtype=torch.bfloat16)
            g = torch.rand(total, hv, device="cuda") * 0.1 + 0.9  # FlashInfer's gate is linear (vLLM passes exp(g))
            beta = torch.rand(total, hv, device="cuda")
            state = torch.zeros(n, hv, d, d, device="cuda")  # vLLM always passes one (zeroed for new prompts)
            cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda", dtype=torch.int32)
            torch.cuda.synchronize()
            begun = time.perf_counter()
            chunk_gated_delta_rule(q=q, k=k, v=v, g=g, beta=beta, initial_state=state, output_final_state=True,
                                   cu_seqlens=cu)
            torch.cuda.synchronize()
            rows.append({"lengths": list(lengths), "num_seqs": n, "call": attempt,
                         "ms": round((time.perf_counter() - begun) * 1e3, 2)})
            print(json.dumps(rows[-1]), flush=True)
    result = {"gpu": torch.cuda.get_device_name(), "sm_count": torch.cuda.get_device_properties(0).multi_processor_count,
              "heads": {"k": hk, "v": hv, "dim": d}, "calls": rows}
    (out / "first_call.json").write_text(json.dumps(result, indent=1))
    return result


def cache_files() -> dict[str, float]:
    found = {}
    for root in CACHES:
        for path in Path(root).rglob("*") if Path(root).is_dir() else ():
            if path.is_file():
                found[str(path)] = path.stat().st_mtime
    return found


def new_files(before: dict[str, float], after: dict[str, float]) -> list[str]:
    return sorted(p for p, t in after.items() if before.get(p) != t)[:200]


def start(args: argparse.Namespace, state: Path) -> tuple[subprocess.Popen, dict, float]:
    device = "cpu" if args.cpu_smoke else "cuda"
    argv = [*CLI, "launch", "--role", args.role, "--device", device, "--run-dir", str(state / "runs"),
            "--base-port", str(args.base_port), "--timeout", str(args.start_timeout), "--json", "--warmup" if args.warmup == "on" else "--no-warmup"]
    if not args.cpu_smoke:
        argv += ["--model", args.model]
    log = open(state / f"launch-{args.role}-{args.warmup}.err", "w")
    begun = time.time()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True)
    text = ""
    while True:  # launch --json prints its endpoints (one JSON object) once every role serves
        line = proc.stdout.readline()
        if not line:
            raise SystemExit(f"launch exited ({proc.wait()}) before serving: {state}/launch-*.err")
        text += line
        try:
            return proc, json.loads(text), time.time() - begun
        except ValueError:
            continue


def served(args: argparse.Namespace) -> dict:
    state = args.out
    proc, endpoints, start_s = start(args, state)
    url = endpoints["endpoints"].get("proxy") or endpoints["endpoints"]["single-0"]
    device = "cpu" if args.cpu_smoke else "cuda"
    common = ["bench", "--deployment", url, "--baseline", "none", "--device", device, "--run-dir",
              str(state / "runs"), *BURST[device], "--json"]
    if not args.cpu_smoke:
        common += ["--model", args.model]
    report: dict = {"role": args.role, "warmup": args.warmup, "start_s": round(start_s, 1),
                    "run_dir": endpoints["run_dir"], "bursts": []}
    try:
        files = cache_files()
        for i, name in enumerate(("first", "again")):
            run = run_json([*CLI, *common, "--prompt-seed", str(7 + i)], state / f"burst_{name}.json", 300)
            after = cache_files()
            report["bursts"].append({"name": name, **client_numbers(run), "cache_files_new": new_files(files, after)})
            files = after
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=120)
    progress = (state / f"launch-{args.role}-{args.warmup}.err").read_text().splitlines()
    report["launch_lines"] = [line for line in progress if "warm" in line or "serving" in line][:40]
    path = state / f"served_{args.role}_{args.warmup}.json"
    path.write_text(json.dumps(report, indent=1))
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=("kernel", "served"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--role", choices=("single", "all"), default="single")
    parser.add_argument("--warmup", choices=("on", "off"), default="on")
    parser.add_argument("--model", default=M60)
    parser.add_argument("--base-port", type=int, default=8000)
    parser.add_argument("--start-timeout", type=float, default=480.0, help="launch's wait per start wave")
    parser.add_argument("--cpu-smoke", action="store_true")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    result = kernel(args.out) if args.step == "kernel" else served(args)
    summary = {k: v for k, v in result.items() if k != "calls"}
    for burst in summary.get("bursts", ()):
        burst.pop("nixl", None), burst.pop("engine", None), burst.pop("prediction", None)
    print(json.dumps(summary, indent=1)[:6000])


if __name__ == "__main__":
    main()
