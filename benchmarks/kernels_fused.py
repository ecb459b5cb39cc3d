"""Benchmark: the issue-7 fused Triton GDN prefill against fla and FlashInfer, timed in the same process.

    python3 benchmarks/kernels_fused.py --out DIR [--tps 1 2 4 8] [--shapes 1x1024 1x8192 ...] [--skip-verify]

First verifies `fused_triton` over the verify matrix on the GPU (the 397B heads at every TP included), then, for
Qwen3.5-397B heads at each TP and batch shape, times fla (default), every FlashInfer knob setting and a sweep of
fused_triton knobs: median GPU time (CUDA events, host running ahead; kernels/timing.py) after warm-up, cycling two
input sets; the host enqueue time is recorded beside it. Prints a markdown table and writes DIR/fused_bench.json
(every setting's time) and DIR/fused_bench.md, rewritten after every shape so a cut-off run still leaves its
results.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

from hybridserve.core.model.dtypes import DType
from hybridserve.core.model.profiles import load_model
from hybridserve.kernels import registry
from hybridserve.kernels.backend import KnobSetting, knob_label
from hybridserve.kernels.backend_fused import FusedTritonBackend, default_knobs
from hybridserve.kernels.cases import case_matrix, model_heads
from hybridserve.kernels.grid import DEFAULT_SHAPES, parse_shape
from hybridserve.kernels.inputs import GdnShape, make_inputs
from hybridserve.kernels.timing import TimingPlan, median_ms, time_calls
from hybridserve.kernels.verify import run_verify

MODEL = "qwen3.5-397b-a17b"
DEVICE = "cuda"  # a smoke test of this script sets "cpu" (with TRITON_INTERPRET=1)
PLAN = TimingPlan(num_warmup=2, max_reps=12, min_reps=5, max_seconds=0.2)
EXTRA_FUSED: tuple[KnobSetting, ...] = (
    (("block_v", 64), ("solve_block", 8)),
    (("chunk_size", 32), ("block_v", 64), ("num_warps", 4)),
    (("chunk_size", 32), ("block_v", 64), ("num_warps", 8), ("num_stages", 2)),
)


class VerifyKnobs(FusedTritonBackend):
    """The default setting, 32-token chunks and a forced context-parallel split (segments of 512)."""

    def knob_space(self, shape: GdnShape) -> list[KnobSetting]:
        return [default_knobs(shape), (("chunk_size", 32), ("block_v", 32), ("num_warps", 8)),
                (("block_v", 64), ("cp_segment", 512))]


def geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x and math.isfinite(x)]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def verify(out: Path, mini: bool = False) -> bool:
    cases = case_matrix(head_dim=128, long_len=1000, model=load_model(MODEL), tps=(1, 2, 4, 8))
    if mini:  # the long single sequence, a zero-length sequence inside a batch, GVA 3, the 397B heads at TP8
        cases = [c for c in cases if c.case_id in ("len1000", "zero-len-inside", "gva3", f"{MODEL}-tp8")]
    started = time.perf_counter()
    report = run_verify([VerifyKnobs()], cases, dtype=DType.BFLOAT16, device=DEVICE)
    rows = [dict(knobs=r.knobs, case=r.case_id, status=r.status.value, o_error=r.o_error,
                 state_error=r.state_error, reason=r.reason) for r in report.results]
    (out / "fused_verify.json").write_text(json.dumps(rows, indent=1))
    worst_o = max((r.o_error or 0) for r in report.results)
    worst_s = max((r.state_error or 0) for r in report.results)
    print(f"verify: {len(report.results)} checks, {len(report.failures)} failures, worst o err {worst_o:.2e}, "
          f"worst state err {worst_s:.2e} ({time.perf_counter() - started:.0f} s)", flush=True)
    for r in report.failures:
        print(f"  FAIL {r.knobs} {r.case_id}: o {r.o_error} state {r.state_error} {r.reason}", flush=True)
    return report.is_ok


QUICK_FUSED: tuple[KnobSetting, ...] = (
    (("block_v", 64),),
    (("chunk_size", 32), ("block_v", 64), ("num_warps", 8)),
    (("chunk_size", 32), ("block_v", 32), ("num_warps", 8)),
    (("block_v", 64), ("num_warps", 8)),
)
QUICK_CP: tuple[KnobSetting, ...] = (
    (("chunk_size", 32), ("block_v", 64), ("num_warps", 8), ("cp_segment", 1024)),
    (("chunk_size", 32), ("block_v", 32), ("num_warps", 8), ("cp_segment", 1024)),
    (("block_v", 64), ("cp_segment", 2048)),
)


def settings_of(shape: GdnShape, quick: bool = False, mini: bool = False) -> list[tuple[str, KnobSetting]]:
    fused = FusedTritonBackend()
    found = [("fla", ())] + [("flashinfer", k) for k in registry.get_backend("flashinfer").knob_space(shape)]
    if mini:
        fused_mini = [default_knobs(shape), (("chunk_size", 32), ("block_v", 32), ("num_warps", 8))]
        return found[:2] + found[3:4] + [("fused_triton", k) for k in dict.fromkeys(fused_mini)]
    if quick:  # the default, 32-token chunks at 8 warps, and context parallelism only where a sequence is long
        cp = QUICK_CP if max(shape.seqlens) > 2048 and shape.num_seqs * shape.num_value_heads < 256 else ()
        return found + [("fused_triton", k) for k in dict.fromkeys([default_knobs(shape), *QUICK_FUSED, *cp])]
    return found + [("fused_triton", k) for k in dict.fromkeys([*fused.knob_space(shape), *EXTRA_FUSED])]


def time_shape(shape: GdnShape, quick: bool, mini: bool = False) -> dict[str, float | str]:
    sets = [make_inputs(shape, device=DEVICE, seed=s) for s in range(2)]
    times: dict[str, float | str] = {}
    for name, knobs in settings_of(shape, quick, mini):
        backend = registry.get_backend(name)
        label = f"{name}[{knob_label(knobs)}]"
        ok, reason = backend.supports(shape, torch.bfloat16, torch.device(DEVICE))
        if not ok:
            times[label] = f"unsupported: {reason}"
            continue
        calls = [lambda x=x: backend.prefill(**x.as_kwargs(), output_final_state=True,
                                             max_seqlen=max(shape.seqlens), **dict(knobs)) for x in sets]
        try:
            samples = time_calls(calls, torch.device(DEVICE), PLAN)  # GPU time with the host running ahead
            times[label] = round(median_ms(samples.device_ms), 5)
            times[f"host {label}"] = f"{median_ms(samples.host_ms):.4f} ms to enqueue"
        except Exception as exc:  # a setting that fails is reported, the sweep goes on
            times[label] = f"error: {type(exc).__name__}: {exc}"[:300]
    del sets
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    return times


def best(times: dict, prefix: str) -> tuple[str | None, float | None]:
    found = [(v, k) for k, v in times.items() if k.startswith(prefix) and isinstance(v, float)]
    return (min(found)[1], min(found)[0]) if found else (None, None)


def _ratio(a, b) -> float | None:
    return a / b if isinstance(a, float) and isinstance(b, float) else None


def summarize(results: list[dict]) -> str:
    lines = ["| TP | shape | fla | FI auto | FI best | fused default | fused best | x fla | FI best / fused | "
             "fused best setting |", "|---|---|---|---|---|---|---|---|---|---|"]
    ratios: dict[str, list] = {"fla": [], "fi": [], "fla_default": [], "fi_default": []}
    wins = 0
    for r in results:
        t = r["times"]
        fla, fi_auto = t.get("fla[default]"), t.get("flashinfer[use_cp=auto]")
        _, fi_best = best(t, "flashinfer[")
        fused_default = t.get(f"fused_triton[{r['default']}]")
        label, fused_best = best(t, "fused_triton[")
        pairs = (("fla", fla, fused_best), ("fi", fi_best, fused_best), ("fla_default", fla, fused_default),
                 ("fi_default", fi_best, fused_default))
        for key, slow, fast in pairs:
            ratios[key].append(_ratio(slow, fast))
        wins += bool((ratios["fi"][-1] or 0) > 1)
        cells = [f"{x:.3f}" if isinstance(x, float) else "-"
                 for x in (fla, fi_auto, fi_best, fused_default, fused_best)]
        cells += [f"{x:.2f}x" if x else "-" for x in (ratios["fla"][-1], ratios["fi"][-1])]
        lines.append(f"| {r['tp']} | {r['shape']} | " + " | ".join(cells) + f" | {label} |")
    g = {k: geomean(v) for k, v in ratios.items()}
    fmt = {k: f"{v:.2f}x" if v else "-" for k, v in g.items()}
    lines.append(f"\ngeomean over fla: best fused setting {fmt['fla']}, default knobs {fmt['fla_default']}; "
                 f"FlashInfer best / fused: best setting {fmt['fi']}, default knobs {fmt['fi_default']}; "
                 f"fused best faster than FlashInfer best on {wins} of {len(results)} shapes")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    parser.add_argument("--tps", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--shapes", nargs="+", default=[s.label for s in DEFAULT_SHAPES])
    parser.add_argument("--skip-verify", action="store_true")
    parser.add_argument("--quick", action="store_true", help="a short knob sweep (device time is scarce)")
    parser.add_argument("--mini", action="store_true", help="4 verify cases, FlashInfer auto/use_cp=True only")
    parser.add_argument("--max-seconds", type=float, default=480.0, help="start no new shape after this")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.skip_verify:
        verify(args.out, mini=args.mini)
    model, results, started_all = load_model(MODEL), [], time.perf_counter()
    for tp in args.tps:
        hk, hv = model_heads(model, tp)
        for text in args.shapes:
            if time.perf_counter() - started_all > args.max_seconds:
                print(f"time budget spent: TP{tp} {text} and later shapes not timed", flush=True)
                continue
            batch = parse_shape(text)
            shape = GdnShape(seqlens=(batch.seq_len,) * batch.num_seqs, num_key_heads=hk, num_value_heads=hv)
            started = time.perf_counter()
            times = time_shape(shape, args.quick, args.mini)
            default = knob_label(FusedTritonBackend().knob_space(shape)[0])
            results.append(dict(tp=tp, shape=batch.label, default=default, times=times))
            print(f"TP{tp} {batch.label}: {time.perf_counter() - started:.0f} s", flush=True)
            table = summarize(results)
            (args.out / "fused_bench.json").write_text(json.dumps(dict(
                gpu=torch.cuda.get_device_name(), torch=torch.__version__, results=results), indent=1))
            (args.out / "fused_bench.md").write_text(table + "\n")
    print(summarize(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
