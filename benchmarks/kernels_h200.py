"""Measures `hybridserve verify` + `hybridserve tune` on the H200 in one process, and the per-call cost of the
plugin's tuned routing against vLLM's own FlashInfer call; feeds BENCHMARKS.md, "GDN prefill kernels".

    python3 benchmarks/kernels_h200.py tune --out $OUT/kernels [--backends fla flashinfer] [--budget-s 400]
    python3 benchmarks/kernels_h200.py route-cost --profile profiles/tuned/h200.yaml --out $OUT/route_cost.json

Run through `benchmarks/h200.sh kernels` (or `kernels-flashqla`), which installs the bundle first.

tune: verify every backend over the case matrix, then tune the model's GDN heads at each TP over the batch shapes,
in one process (FlashInfer's CuTe DSL compile cache is per process). Writes under --out: verify.txt / verify.json,
tune.txt, h200.yaml (the tuned profile, rewritten after each TP so a timeout keeps what was measured), log.txt.
Runs from a checkout without installing it (a symlink named `hybridserve` to the checkout goes on sys.path). The
PNG plot is made from the YAML afterwards when matplotlib is missing there.

route-cost: for each batch shape (one GDN layer of the 397B at --tp: q/k [1, T, Hk, 128], v [1, T, Hv, 128], the
state [N, Hv, V, K] float32, as vLLM's `ChunkGatedDeltaRule` receives them) it times vLLM's
`fi_chunk_gated_delta_rule` (what `--gdn-prefill-backend flashinfer` runs) and the plugin's routed call
(gdn_dispatch.routed: nearest bucket, then the winner through the kernels adapter), with vLLM's l2norm kernel and
with the torch one. Host ms: the call returns (no sync); wall ms: the call plus torch.cuda.synchronize(). Medians
of --reps calls after warm-up. Needs vLLM 0.26 (CUDA).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _importable() -> None:
    try:
        import hybridserve  # noqa: F401
    except ImportError:
        link_dir = Path(tempfile.mkdtemp(prefix="hs-"))
        (link_dir / "hybridserve").symlink_to(ROOT)
        sys.path.insert(0, str(link_dir))


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    tune = sub.add_parser("tune", help="verify + tune in one process")
    tune.add_argument("--out", type=Path, required=True)
    tune.add_argument("--model", default="qwen3.5-397b-a17b")
    tune.add_argument("--tp", type=int, nargs="+", default=[1, 2, 4, 8])
    tune.add_argument("--backends", nargs="+", default=["fla", "flashinfer"])
    tune.add_argument("--verify-backends", nargs="+", default=["torch", "fla", "flashinfer"])
    tune.add_argument("--budget-s", type=float, default=560.0)
    tune.add_argument("--skip-verify", action="store_true")
    tune.add_argument("--shapes", nargs="+", default=None, help="NxL batch shapes; default: the 5 default shapes")
    tune.add_argument("--head-dim", type=int, default=128, help="head size of the generic verify cases")
    tune.add_argument("--long-len", type=int, default=1000)
    tune.add_argument("--verify-cases", nargs="+", default=None, help="case ids to verify; default: all")
    cost = sub.add_parser("route-cost", help="per-call cost of the tuned routing against vLLM's FlashInfer call")
    cost.add_argument("--profile", type=Path, required=True)
    cost.add_argument("--tp", type=int, default=2)
    cost.add_argument("--shapes", nargs="+", default=["1x1024", "1x8192", "4x4096"])
    cost.add_argument("--reps", type=int, default=50)
    cost.add_argument("--out", type=Path, required=True)
    return ap


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    _importable()
    if args.mode == "route-cost":
        route_cost(args)
        return 0
    return tune(args)


def tune(args: argparse.Namespace) -> int:
    from rich.console import Console

    import hybridserve.cli.tune as tune_cli
    import hybridserve.cli.verify as verify_cli
    from hybridserve.core.model.profiles import load_model
    from hybridserve.kernels import registry
    from hybridserve.kernels.cases import case_matrix
    from hybridserve.kernels.verify import run_verify

    started = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    log = open(args.out / "log.txt", "a", buffering=1)

    def say(msg: str) -> None:
        line = f"[{time.time() - started:7.1f}s] {msg}"
        print(line, flush=True)
        log.write(line + "\n")

    spec = load_model(args.model)
    if not args.skip_verify:
        say("verify: start")
        cases = case_matrix(head_dim=args.head_dim, long_len=args.long_len, model=spec, tps=tuple(args.tp))
        cases = [c for c in cases if args.verify_cases is None or c.case_id in args.verify_cases]
        report = run_verify(registry.select(args.verify_backends), cases,
                            progress=lambda s: log.write(f"[{time.time() - started:7.1f}s] {s}\n"))
        with open(args.out / "verify.txt", "w") as fh:
            verify_cli.out_console = Console(file=fh, width=200)
            verify_cli._render(report)
        (args.out / "verify.json").write_text(json.dumps(verify_cli._as_dict(report), indent=1, default=str))
        say(f"verify: done, ok={report.is_ok}, failures={len(report.failures)}, "
            f"unavailable={report.unavailable}")
        print((args.out / "verify.txt").read_text(), flush=True)
    _tune_each_tp(args, spec, started, say, tune_cli, lambda s: log.write(f"[{time.time() - started:7.1f}s] {s}\n"))
    return 0


def _tune_each_tp(args, spec, started: float, say, tune_cli, note) -> None:
    import dataclasses

    import torch
    from rich.console import Console

    from hybridserve.kernels import registry
    from hybridserve.kernels.grid import DEFAULT_SHAPES, parse_shape
    from hybridserve.kernels.summary import closest_vllm_setting
    from hybridserve.kernels.tune import TuneRequest, run_tune
    from hybridserve.kernels.tuned_profile import write_profile

    backends = tuple(registry.select(args.backends))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shapes = tuple(parse_shape(s) for s in args.shapes) if args.shapes else DEFAULT_SHAPES
    path = args.out / "h200.yaml"
    merged = None
    for tp in args.tp:
        if time.time() - started > args.budget_s:
            say(f"tune: budget spent, TP{tp} skipped")
            continue
        req = TuneRequest(model=spec, tps=(tp,), shapes=shapes, backends=backends, device=device)
        profile = run_tune(req, progress=note)
        entries = (merged.entries if merged else ()) + profile.entries
        setting, times = closest_vllm_setting(list(entries), backends)
        merged = dataclasses.replace(profile, entries=entries, vllm_gdn_prefill_backend=setting,
                                     vllm_setting_geomean_ms=times)
        write_profile(merged, path)
        for e in profile.entries:
            say(f"tune TP{tp} {e.num_seqs}x{e.seq_len}: {e.winner.label} {e.winner_ms:.4f} ms, "
                f"fla {e.fla_ms}, FI auto {e.flashinfer_auto_ms}, best {e.best_ms:.4f}, "
                f"rejected {e.rejected}")
    if merged is None:
        return
    with open(args.out / "tune.txt", "w") as fh:
        tune_cli.out_console = Console(file=fh, width=200)
        tune_cli._render(merged, path, path.with_suffix(".png"))
    print((args.out / "tune.txt").read_text(), flush=True)
    try:
        from hybridserve.kernels.plot import write_plot

        write_plot(merged, path.with_suffix(".png"))
    except Exception as exc:  # matplotlib may be missing on the GPU host; the plot is remade from the YAML
        say(f"plot skipped: {type(exc).__name__}: {exc}")
    say("done")


# route-cost: one GDN layer call at a time


def _layer_inputs(num_seqs: int, seq_len: int, hk: int, hv: int, dim: int = 128):
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


def _timed(fn, reps: int) -> dict:
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


def route_cost(args: argparse.Namespace) -> None:

    from vllm.model_executor.layers.mamba.gdn import qwen_gdn_linear_attn as qwen

    from hybridserve.core.vllm_plugin.gdn_dispatch import LazyRouter, routed

    hk, hv = 16 // args.tp, 64 // args.tp

    def native(q, k, v, g, beta, initial_state, output_final_state, cu_seqlens=None, chunk_indices=None,
               chunk_offsets=None, use_qk_l2norm_in_kernel=True, core_attn_out=None):
        o, final = qwen.fi_chunk_gated_delta_rule(q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state,
                                                  output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                                                  use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
        if core_attn_out is not None:
            core_attn_out.reshape(-1)[: o.numel()].copy_(o.reshape(-1))
        return o, final

    router = LazyRouter(str(args.profile), False)
    calls = {"vllm_flashinfer": native,
             "routed_vllm_l2norm": routed(native, "flashinfer", router, qwen.l2norm_fwd),
             "routed_torch_l2norm": routed(native, "flashinfer", router, None)}
    rows = []
    for text in args.shapes:
        n, length = (int(x) for x in text.split("x"))
        q, k, v, g, beta, state, cu, out = _layer_inputs(n, length, hk, hv)
        route = router.get().route(q=q, v=v, num_seqs=n, is_native=lambda *a: False)
        row = {"shape": text, "heads": f"{hk}/{hv}", "route": route.label}
        for name, call in calls.items():
            row[name] = _timed(lambda call=call: call(q, k, v, g, beta, state, True, cu_seqlens=cu,
                                                     core_attn_out=out), args.reps)
        rows.append(row)
        print(json.dumps(row), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")
    sys.exit(main(sys.argv[1:]))
