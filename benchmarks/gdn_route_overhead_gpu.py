"""Per-call cost of the plugin's GDN prefill routing against vLLM's own FlashInfer call, one layer call at a time.

    python benchmarks/gdn_route_overhead_gpu.py --profile h200.yaml --out $OUT/route_overhead.json   # vLLM 0.26, H200

For each batch shape (one GDN layer of the 397B at --tp: q/k [1, T, Hk, 128], v [1, T, Hv, 128], the state
[N, Hv, V, K] float32, as vLLM's `ChunkGatedDeltaRule` receives them) it times vLLM's `fi_chunk_gated_delta_rule`
(what `--gdn-prefill-backend flashinfer` runs) and the plugin's routed call (gdn_dispatch._routed: nearest bucket,
then the winner through the kernels adapter), with vLLM's l2norm kernel and with the torch one. Host ms: the call
returns (no sync); wall ms: the call plus torch.cuda.synchronize(). Medians of --reps calls after warm-up.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path


def inputs(num_seqs: int, seq_len: int, hk: int, hv: int, dim: int = 128):
    import torch

    t = num_seqs * seq_len
    dev, bf = "cuda", torch.bfloat16
    q = torch.randn(1, t, hk, dim, device=dev, dtype=bf)
    k = torch.randn(1, t, hk, dim, device=dev, dtype=bf)
    v = torch.randn(1, t, hv, dim, device=dev, dtype=bf)
    g = -torch.nn.functional.softplus(torch.randn(1, t, hv, device=dev, dtype=torch.float32))
    beta = torch.rand(1, t, hv, device=dev, dtype=bf)
    state = torch.randn(num_seqs, hv, dim, dim, device=dev, dtype=torch.float32) * 0.01
    cu = torch.arange(0, t + 1, seq_len, device=dev, dtype=torch.int32)
    out = torch.empty(1, t, hv, dim, device=dev, dtype=bf)
    return q, k, v, g, beta, state, cu, out


def timed(fn, reps: int) -> dict:
    import torch

    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    host, wall = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        host.append((t1 - t0) * 1e3)
        wall.append((t2 - t0) * 1e3)
    return {"host_ms": round(statistics.median(host), 4), "wall_ms": round(statistics.median(wall), 4)}


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", type=Path, required=True)
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--shapes", nargs="+", default=["1x1024", "1x8192", "4x4096"])
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)

    from vllm.model_executor.layers.mamba.gdn import qwen_gdn_linear_attn as qwen

    from hybridserve.core.vllm_plugin.gdn_dispatch import _LazyRouter, _routed

    hk, hv = 16 // args.tp, 64 // args.tp

    def native(q, k, v, g, beta, initial_state, output_final_state, cu_seqlens=None, chunk_indices=None,
               chunk_offsets=None, use_qk_l2norm_in_kernel=True, core_attn_out=None):
        o, final = qwen.fi_chunk_gated_delta_rule(q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state,
                                                  output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                                                  use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
        if core_attn_out is not None:
            core_attn_out.reshape(-1)[: o.numel()].copy_(o.reshape(-1))
        return o, final

    router = _LazyRouter(str(args.profile), False)
    calls = {"vllm_flashinfer": native,
             "routed_vllm_l2norm": _routed(native, "flashinfer", router, qwen.l2norm_fwd),
             "routed_torch_l2norm": _routed(native, "flashinfer", router, None)}
    rows = []
    for text in args.shapes:
        n, length = (int(x) for x in text.split("x"))
        q, k, v, g, beta, state, cu, out = inputs(n, length, hk, hv)
        route = router.get().route(q=q, v=v, num_seqs=n, is_native=lambda *a: False)
        row = {"shape": text, "heads": f"{hk}/{hv}", "route": route.label}
        for name, call in calls.items():
            row[name] = timed(lambda call=call: call(q, k, v, g, beta, state, True, cu_seqlens=cu,
                                                     core_attn_out=out), args.reps)
        rows.append(row)
        print(json.dumps(row), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
