"""Measures the NIXL READ that `hybridserve transfer bench` posts, at 1 GiB (`make bench-transfer`); feeds
BENCHMARKS.md, "1 GiB DRAM READ against the in-process copy, CPU".

One ~1 GiB request (Qwen3.5-397B TP1, bf16 SSM, 32k prompt: 1.10 GB) READ over NIXL (DRAM, cma)
between two processes, against copying the same bytes inside one process.

  .venv/bin/python benchmarks/transfer_dram_1gib.py --requests 9
Prints median and best GB/s for our scheme (contiguous ids: 60 descriptors) and vLLM's (62,490), and the
in-process copies: torch's (all cores) and numpy's (one core; cma copies on one core too).
"""

from __future__ import annotations

import argparse
import statistics

from hybridserve.core.layout.descriptors import Scheme
from hybridserve.core.model.dtypes import DType
from hybridserve.core.layout.rank_layout import LayoutRequest
from hybridserve.core.layout.attention_backend import AttentionBackend
from hybridserve.core.layout.plan import PlanRequest, make_plan
from hybridserve.core.model.profiles import load_model
from hybridserve.transfer.blocks import Allocation, BlockPool, allocate, blocks_per_group
from hybridserve.transfer.cluster import Cluster


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=9)
    args = parser.parse_args()
    prompt = 32768
    layout = LayoutRequest(model=load_model("qwen3.5-397b-a17b"), ssm_dtype=DType.BFLOAT16,
                           backend=AttentionBackend.FLASHINFER)
    plan = make_plan(PlanRequest(layout=layout, prompt_tokens=(prompt,)))
    n = 2 + sum(blocks_per_group(plan.decode, prompt))
    print("| scheme | descriptors | GB moved | median GB/s | best GB/s | exact |\n|---|---|---|---|---|---|")
    with Cluster(1, 1) as cluster:
        cluster.setup(plan, n)
        for scheme in (Scheme.OURS, Scheme.VLLM):
            blocks = allocate(BlockPool(n, seed=1), BlockPool(n, seed=2), plan.decode, prompt, Allocation.CONTIGUOUS)
            runs = [cluster.move(blocks, scheme, f"{scheme.value}{k}")[0] for k in range(args.requests)]
            exact = cluster.check(blocks, scheme)[0]["is_exact"]
            rates = [r["num_bytes"] / r["transfer_s"] / 1e9 for r in runs]
            print(f"| {scheme.value} | {runs[0]['num_descriptors']:,} | {runs[0]['num_bytes'] / 1e9:.2f} | "
                  f"{statistics.median(rates):.2f} | {max(rates):.2f} | {'yes' if exact else 'NO'} |")
        size = runs[0]["num_bytes"]
        for name, one in (("torch copy_ (all cores)", False), ("numpy copyto (one core)", True)):
            best = cluster.decode[0].call("copy_baseline", 120, num_bytes=size, repeats=5, one_thread=one)
            print(f"| in-process {name} | - | {size / 1e9:.2f} | - | {size / best / 1e9:.2f} | - |")


if __name__ == "__main__":
    main()
