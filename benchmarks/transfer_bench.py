"""Measures `hybridserve transfer bench --memory dram` (`make bench-transfer`); feeds BENCHMARKS.md,
"Transfer" (benchmarks/DETAILS.md, "Both schemes at 1k / 8k / 32k, CPU").

One request's KV + GDN state over NIXL between rank processes, vLLM's descriptors vs ours.

Prints the markdown table recorded in BENCHMARKS.md and writes JSON and a PNG:
  .venv/bin/python benchmarks/transfer_bench.py --memory dram --out benchmarks/results
Cases: Qwen3.5-397B-A17B TP1->1 (bf16 SSM, FlashInfer 16-token kernel blocks: vLLM's 16,260 descriptors at 8k)
and Qwen3.5-0.8B TP2->1 (heterogeneous TP: strided head slices), prompts 1k/8k/32k, both schemes, contiguous
and fragmented block ids. The 32k 397B request is 1.10 GB (~1 GiB): its GB/s beside the in-process copy is the
'>= 50 % of memcpy' check.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from hybridserve.core.model.dtypes import DType
from hybridserve.core.model.profiles import load_model
from hybridserve.transfer.xfer_bench import BenchRequest, Memory, run_bench
from hybridserve.transfer.report import write_png

CASES = [("qwen3.5-397b-a17b", 1, 1, DType.BFLOAT16), ("qwen3.5-0.8b", 2, 1, None)]


def markdown(results) -> str:
    lines = ["| model | TP | prompt | scheme | block ids | descriptors | elements | after NIXL merge | MB moved | "
             "prepare ms | transfer ms | GB/s | in-process copy GB/s | exact |", "|" + "---|" * 14]
    for res in results:
        for r in res.rows:
            lines.append(f"| {res.model} | {res.prefill_tp}->{res.decode_tp} | {r.prompt_tokens:,} | {r.scheme} | "
                         f"{r.allocation} | {r.num_descriptors:,} | {r.num_elements:,} | {r.num_merged:,} | "
                         f"{r.num_bytes / 1e6:,.1f} | {r.prepare_ms:.2f} | {r.transfer_ms:.1f} | {r.gbps:.2f} | "
                         f"{r.copy_gbps:.2f} | {'yes' if r.is_exact else 'NO'} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--memory", default="dram", choices=["dram", "vram"])
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--prompt-len", type=int, action="append")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()
    results = []
    for model, ptp, dtp, ssm in CASES:
        results.append(run_bench(BenchRequest(
            model=load_model(model), prefill_tp=ptp, decode_tp=dtp, ssm_dtype=ssm, memory=Memory(args.memory),
            prompt_tokens=tuple(args.prompt_len or (1024, 8192, 32768)), num_requests=args.requests),
            on_step=lambda tag: print("done", tag, flush=True)))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"transfer_{args.memory}.json").write_text(json.dumps([asdict(r) for r in results], indent=1))
    write_png(results, args.out / f"transfer_{args.memory}.png")
    print(markdown(results))


if __name__ == "__main__":
    main()
