"""`hybridserve verify`: is every GDN prefill backend (and knob setting) numerically right on this machine?"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from hybridserve.cli.console import err_console, library_output_to_stderr, out_console, print_json
from hybridserve.cli.options import JsonOpt, ModelOpt, TpsOpt, trailing_values

Backends = Annotated[Optional[list[str]], typer.Option("--backend", "-b", help="Backend to check (repeat).")]


def command(
    ctx: typer.Context,
    backend: Backends = None,
    model: ModelOpt = "qwen3.5-397b-a17b",
    tp: TpsOpt = None,
    dtype: Annotated[str, typer.Option(help="Input dtype of q, k, v: bf16, fp16, fp32.")] = "bf16",
    device: Annotated[Optional[str], typer.Option(help="cpu or cuda; default: cuda when present.")] = None,
    head_dim: Annotated[int, typer.Option(help="Head size of the generic cases.")] = 128,
    long_len: Annotated[int, typer.Option(help="Length of the long single-sequence case.")] = 1000,
    tolerance: Annotated[Optional[float], typer.Option(help="Relative L2 tolerance; default per dtype.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Check each backend x knob setting against the float64 judge on the case matrix: lengths 1, 63, 65 and
    --long-len, empty sequences inside a batch, ragged batches, initial state, GVA 1-4 and the model's heads at each
    TP. Relative L2 error of the output and the final state; NaN never passes. Exit 1 when any case fails.

    Examples:
      hybridserve verify
      hybridserve verify --backend torch --backend vllm-cpu --model qwen3.5-0.8b --tp 1 2 --head-dim 64 --json
    """
    from hybridserve.core.model.dtypes import DType
    from hybridserve.core.common.errors import InputError
    from hybridserve.core.model.profiles import load_model
    from hybridserve.kernels import registry
    from hybridserve.kernels.cases import case_matrix
    from hybridserve.kernels.verify import count_steps, require_pass, run_verify

    tps, _ = trailing_values(tp, ctx.args)
    if device not in (None, "cpu", "cuda"):
        raise InputError(f"--device {device}: accepted: cpu, cuda")
    in_dtype = DType.parse(dtype, what="--dtype")
    spec = load_model(model)
    cases = case_matrix(head_dim=head_dim, long_len=long_len, model=spec, tps=tps)
    backends = registry.select(backend)
    with library_output_to_stderr(), _progress(count_steps(backends, cases), quiet=as_json) as step:
        report = run_verify(backends, cases, dtype=in_dtype, device=device, tolerance=tolerance, progress=step)
    if as_json:
        print_json(_as_dict(report))
    else:
        _render(report)
    require_pass(report)


def _progress(total: int, *, quiet: bool):
    from contextlib import contextmanager

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    @contextmanager
    def bar():
        with Progress(TextColumn("verify {task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=err_console, transient=True, disable=quiet) as progress:
            task = progress.add_task("", total=total)
            yield lambda label: progress.update(task, advance=1, description=label)

    return bar()


def _as_dict(report) -> dict:
    return {
        "device": report.device, "dtype": report.dtype.value, "ok": report.is_ok,
        "unavailable": [{"backend": n, "reason": r} for n, r in report.unavailable],
        "results": [{"backend": r.backend, "knobs": r.knobs, "case": r.case_id, "status": r.status.value,
                     "o_error": r.o_error, "state_error": r.state_error, "tolerance": r.tolerance,
                     "reason": r.reason, "call_ms": r.call_ms} for r in report.results],
    }


def _max_err(errors) -> str:  # noqa: ANN001
    measured = [e for e in errors if e is not None]
    return f"{max(measured):.2e}" if measured else "-"


def _render(report) -> None:
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"GDN prefill verify on {report.device}, {report.dtype.value} inputs, vs float64 judge")
    table.add_column("backend", no_wrap=True)
    table.add_column("knobs", no_wrap=True)
    for col in ("pass", "fail", "n/a", "max o err", "max S err"):
        table.add_column(col, justify="right")
    groups: dict[tuple[str, str], list] = {}
    for r in report.results:
        groups.setdefault((r.backend, r.knobs), []).append(r)
    for (name, knobs), rows in groups.items():
        errs = [r for r in rows if r.o_error is not None]
        failed = [r.case_id for r in rows if r.status.is_failure]
        table.add_row(name, knobs, str(sum(r.status.value == "pass" for r in rows)),
                      f"[red]{len(failed)}[/]" if failed else "0",
                      str(sum(r.status.value == "unsupported" for r in rows)),
                      _max_err(r.o_error for r in errs), _max_err(r.state_error for r in errs))
    for name, _ in report.unavailable:
        table.add_row(name, "-", "-", "-", "-", "-", "-")
    out_console.print(table)
    for name, reason in report.unavailable:  # the reason below the table, not in a number column
        out_console.print(escape(f"  unavailable {name}: {reason}"), highlight=False)
    for r in report.results:
        if r.status.value != "pass":
            err = f"o {r.o_error:.2e} state {r.state_error:.2e}" if r.o_error is not None else r.reason
            out_console.print(escape(f"  {r.status.value:11} {r.backend}[{r.knobs}] {r.case_id}: {err}"),
                              highlight=False)
