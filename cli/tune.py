"""`hybridserve tune`: the fastest verified GDN prefill backend setting per TP and batch shape, on this machine."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from hybridserve.cli.console import err_console, library_output_to_stderr, out_console, print_json
from hybridserve.cli.options import JsonOpt, ModelOpt, TpsOpt, trailing_values

Shapes = Annotated[Optional[list[str]], typer.Option("--shapes", help="Batch shapes NxL: --shapes 1x1024 4x4096.")]
PromptLengths = Annotated[Optional[Path], typer.Option(help="File of prompt lengths: shapes from p50/p90/p99.")]
Backends = Annotated[Optional[list[str]], typer.Option("--backend", "-b", help="Backend to consider (repeat).")]
RankByOpt = Annotated[str, typer.Option(help="Pick winners by gpu time (host runs ahead) or host-inclusive latency.")]
Merge = Annotated[Optional[list[Path]], typer.Option(help="Merge tuned profiles made in separate processes (repeat); "
                                                       "no timing.")]


def command(
    ctx: typer.Context,
    model: ModelOpt = "qwen3.5-397b-a17b",
    tp: TpsOpt = None,
    shapes: Shapes = None,
    prompt_lengths: PromptLengths = None,
    backend: Backends = None,
    dtype: Annotated[str, typer.Option(help="Input dtype: bf16, fp16, fp32.")] = "bf16",
    out: Annotated[Path, typer.Option(help="Tuned profile YAML to write.")] = Path("tuned-gdn-prefill.yaml"),
    plot: Annotated[Optional[Path], typer.Option(help="PNG plot; default: beside --out.")] = None,
    reps: Annotated[int, typer.Option(help="Timed repetitions per setting (median).")] = 20,
    input_sets: Annotated[int, typer.Option(help="Input sets to cycle through.")] = 3,
    verify_max_len: Annotated[int, typer.Option(help="Check each setting on lengths capped here.")] = 4096,
    rank_by: RankByOpt = "gpu",
    merge: Merge = None,
    as_json: JsonOpt = False,
) -> None:
    """Time every backend x knob setting (each verified against the float64 judge first) for the model's GDN
    heads at each TP and each batch shape; write the tuned profile (YAML) that `dispatch` loads, and a plot.
    Without a GPU the CPU backends are tuned, and it says so. Each setting's GPU time, host (enqueue) time,
    host-inclusive latency and first-call (compile) time are recorded; --rank-by picks the winner by GPU time or
    by host-inclusive latency. FlashQLA needs its own environment: tune it in its own process and --merge.

    Examples:
      hybridserve tune --model qwen3.5-397b-a17b --tp 1 2 4 8 --out h200-tuned.yaml   # on a GPU
      hybridserve tune --model qwen3.5-0.8b --tp 4 --shapes 1x256 2x128 --reps 5 --rank-by host
      hybridserve tune --merge fi.yaml --merge flashqla.yaml --out h200-tuned.yaml
    """
    import torch

    from hybridserve.core.model.dtypes import DType
    from hybridserve.core.common.errors import InputError
    from hybridserve.core.model.profiles import load_model
    from hybridserve.kernels import registry
    from hybridserve.kernels.grid import CPU_DEFAULT_SHAPES, DEFAULT_SHAPES, parse_shape, shapes_from_lengths
    from hybridserve.kernels.plot import write_plot
    from hybridserve.kernels.timing import TimingPlan
    from hybridserve.kernels.tune import TuneRequest, run_tune
    from hybridserve.kernels.tuned_profile import to_dict, write_profile

    from hybridserve.core.common.output_path import check_output_path
    from hybridserve.kernels.tuned_profile import RankBy

    check_output_path(out, "--out")
    if merge:
        return _merge(merge, out, as_json)
    check_output_path(plot or out.with_suffix(".png"), "--plot")
    tps, extra_shapes = trailing_values(tp, ctx.args, takes_shapes=True)
    if reps < 1 or input_sets < 1 or verify_max_len < 1:
        raise InputError("--reps, --input-sets and --verify-max-len: accepted: integers >= 1")
    grid = [parse_shape(s) for s in (shapes or []) + extra_shapes]
    if prompt_lengths is not None:
        grid += shapes_from_lengths(prompt_lengths)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    backends = tuple(b for b in registry.select(backend) if device.type in b.capabilities.devices)
    if device.type == "cpu":
        default = "" if grid else f" on the CPU grid {' '.join(s.label for s in CPU_DEFAULT_SHAPES)}"
        grid = grid or list(CPU_DEFAULT_SHAPES)
        err_console.print("no CUDA GPU here: tuning the CPU backends "
                          f"({', '.join(b.name for b in backends)}) with perf_counter timings{default}")
    req = TuneRequest(model=load_model(model), tps=tps,
                      shapes=tuple(grid) or DEFAULT_SHAPES, backends=backends, device=device,
                      dtype=DType.parse(dtype, what="--dtype"), verify_max_len=verify_max_len,
                      num_input_sets=input_sets, timing=TimingPlan(max_reps=reps, min_reps=min(3, reps)),
                      rank_by=RankBy.parse(rank_by))
    from hybridserve.kernels.cases import model_heads

    for t in req.tps:
        model_heads(req.model, t)  # refuse a bad --tp before any work
    with library_output_to_stderr(), _progress(len(req.tps) * len(req.shapes), quiet=as_json) as step:
        profile = run_tune(req, progress=step)
    write_profile(profile, out)
    write_plot(profile, plot or out.with_suffix(".png"))
    if as_json:
        print_json(to_dict(profile))
    else:
        _render(profile, out, plot or out.with_suffix(".png"))


def _merge(paths: list[Path], out: Path, as_json: bool) -> None:
    from hybridserve.kernels.profile_merge import merge_profiles
    from hybridserve.kernels.tuned_profile import read_profile, to_dict, write_profile

    profile = merge_profiles([(str(p), read_profile(p)) for p in paths])
    write_profile(profile, out)
    if as_json:
        print_json(to_dict(profile))
    else:
        _render(profile, out, None)


def _progress(num_shapes: int, *, quiet: bool):
    from contextlib import contextmanager

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    @contextmanager
    def bar():
        with Progress(TextColumn("tune {task.description}"), BarColumn(), TimeElapsedColumn(), console=err_console,
                      transient=True, disable=quiet) as progress:
            task = progress.add_task("", total=num_shapes)
            seen: set[str] = set()

            def step(label: str) -> None:
                shape = " ".join(label.split()[:2])
                if shape not in seen:
                    if seen:
                        progress.advance(task)
                    seen.add(shape)
                progress.update(task, description=label)

            yield step

    return bar()


def _render(profile, out: Path, plot: Path | None) -> None:
    from rich.markup import escape
    from rich.table import Table

    from hybridserve.kernels.summary import summarize

    def ms(x):
        return f"{x:.3f}" if x else "-"

    table = Table(title=f"GDN prefill tune: {profile.model}, {profile.dtype}, {profile.gpu} (median ms; winners by "
                        f"{profile.rank_by})")
    for col in ("TP", "heads k/v", "shape", "winner", "gpu", "host", "latency", "1st call", "fla", "FI auto",
                "x fla", "x FI auto", "vs best"):
        table.add_column(col, no_wrap=col == "winner", justify="left" if col == "winner" else "right")
    for e in profile.entries:
        label, ranked = e.winner.label, profile.ranked_times(e)
        table.add_row(str(e.tp), f"{e.num_key_heads}/{e.num_value_heads}", f"{e.num_seqs}x{e.seq_len}",
                      escape(label), ms(e.winner_ms), ms(e.host_ms.get(label)), ms(e.latency_ms.get(label)),
                      ms(e.first_call_ms.get(label)), ms(e.fla_ms), ms(e.flashinfer_auto_ms),
                      f"{e.fla_ms / e.winner_ms:.2f}" if e.fla_ms else "-",
                      f"{e.flashinfer_auto_ms / e.winner_ms:.2f}" if e.flashinfer_auto_ms else "-",
                      f"{100 * (ranked[label] / min(ranked.values()) - 1):+.1f}%" if label in ranked else "-")
    out_console.print(table)
    s = summarize(profile)

    def x(v):
        return f"{v:.2f}x" if v else "n/a"

    out_console.print(f"geomean speedup (gpu time): vs fla {x(s.speedup_vs_fla)}, vs FlashInfer auto "
                      f"{x(s.speedup_vs_flashinfer_auto)} (host-inclusive {x(s.latency_speedup_vs_flashinfer_auto)}), "
                      f"vs best fixed setting ({escape(str(s.best_fixed_setting))}) {x(s.speedup_vs_best_fixed)}; "
                      f"worst loss to the best setting on a shape ({profile.rank_by}) "
                      f"{100 * s.worst_loss_vs_best:.1f}%", highlight=False)
    out_console.print(f"closest single vLLM setting: gdn_prefill_backend={profile.vllm_gdn_prefill_backend} "
                      f"{profile.vllm_setting_geomean_ms}", highlight=False)
    out_console.print(f"wrote {out}" + (f" and {plot}" if plot else ""), highlight=False)
