"""GPU run of issue 3 in one process (FlashInfer's CuTe DSL compile cache is per process): verify every backend
over the whole case matrix, then tune the model's GDN heads at each TP over the batch shapes.

    python3 benchmarks/kernels_gpu.py --out $OUT [--model qwen3.5-397b-a17b] [--tp 1 2 4 8] [--budget-s 560]

Writes under --out: verify.txt / verify.json, tune.txt, <gpu>.yaml (the tuned profile, rewritten after each TP so a
timeout keeps what was measured), log.txt. Runs from a checkout without installing it (a symlink named
`hybridserve` to the checkout goes on sys.path). The PNG plot is made from the YAML afterwards when matplotlib is
missing here.
"""

from __future__ import annotations

import argparse
import json
import os
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


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--model", default="qwen3.5-397b-a17b")
    ap.add_argument("--tp", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--backends", nargs="+", default=["fla", "flashinfer"])
    ap.add_argument("--verify-backends", nargs="+", default=["torch", "fla", "flashinfer"])
    ap.add_argument("--budget-s", type=float, default=560.0)
    ap.add_argument("--skip-verify", action="store_true")
    ap.add_argument("--shapes", nargs="+", default=None, help="NxL batch shapes; default: the 5 default shapes")
    ap.add_argument("--head-dim", type=int, default=128, help="head size of the generic verify cases")
    ap.add_argument("--long-len", type=int, default=1000)
    ap.add_argument("--verify-cases", nargs="+", default=None, help="case ids to verify; default: all")
    args = ap.parse_args()
    _importable()
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
    _tune(args, spec, started, say, tune_cli, lambda s: log.write(f"[{time.time() - started:7.1f}s] {s}\n"))
    return 0


def _tune(args, spec, started: float, say, tune_cli, note) -> None:
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


if __name__ == "__main__":
    os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")
    sys.exit(main())
