"""`hybridserve step-profile`: measure the step-time profile `plan --gpus` sizes with, against servers that run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from hybridserve.cli.console import err_console, out_console, print_json
from hybridserve.cli.options import JsonOpt
from hybridserve.core.common.errors import InputError


def _ints(text: str, flag: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise InputError(f"{flag} {text!r}: accepted: positive integers separated by commas, e.g. 64,256,1024")
    return values


def command(
    model: Annotated[Path, typer.Option("--model", "-m", help="The model folder the server serves.")],
    out: Annotated[Path, typer.Option(help="Write the profile (YAML) here.")],
    replica: Annotated[Optional[str], typer.Option(help="URL of one plain vLLM server of the unit (a replica, "
                                                   "launch --replicas or --role single).")] = None,
    steps_from: Annotated[Optional[Path], typer.Option(help="Keep this profile's steps; measure only the "
                                                       "transfer (--pd).")] = None,
    pd: Annotated[Optional[str], typer.Option(help="URL of a 1P1D proxy of the same units: the transfer's "
                                              "cost (default: not measured, zero).")] = None,
    calibrate: Annotated[Optional[list[str]], typer.Option(help="URL of a proxy (replicas or P/D) whose load factor "
                                                           "to measure, repeatable.")] = None,
    unit: Annotated[str, typer.Option(help="What one engine has, in words (the profile's unit).")] = "one CPU core",
    device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
    max_num_seqs: Annotated[int, typer.Option(help="The server's --max-num-seqs.")] = 8,
    max_num_batched_tokens: Annotated[int, typer.Option(help="The server's --max-num-batched-tokens.")] = 2048,
    max_model_len: Annotated[int, typer.Option(help="The server's --max-model-len.")] = 2048,
    prefill_lens: Annotated[str, typer.Option(help="Idle prompt lengths (TTFT).")] = "64,256,512,1024,1536",
    batches: Annotated[str, typer.Option(help="Decode batch sizes (ITL).")] = "1,2,4,8",
    decode_lens: Annotated[str, typer.Option(help="Prompt lengths of the decode batches.")] = "128,1024",
    decode_output: Annotated[int, typer.Option(help="Output tokens of each decode request.")] = 32,
    transfer_lens: Annotated[str, typer.Option(help="Prompt lengths of P/D's idle requests.")] = "256,1024,1536",
    repeats: Annotated[int, typer.Option(min=1, help="Idle requests per length.")] = 3,
    num_blocks: Annotated[Optional[int], typer.Option(help="KV cache blocks of one engine (default: the "
                                                      "server's /metrics).")] = None,
    tp: Annotated[int, typer.Option(help="The server's TP.")] = 1,
    name: Annotated[Optional[str], typer.Option(help="The profile's name (default: --out's stem).")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds per request.")] = 600.0,
    as_json: JsonOpt = False,
) -> None:
    """Measure a step-time profile with bench's phases and fit it; `plan --gpus PROFILE:N` sizes with it.

    Idle TTFT at each prompt length and the ITL of decode batches on one plain server give the step costs; idle
    P/D requests (--pd) give the transfer's; a closed-loop phase through a proxy (--calibrate) gives its kind's load
    factor (steps under load over the idle fit). The fit's residuals are in the file. See docs/sizing.md.

    Examples:

      hybridserve step-profile --replica http://127.0.0.1:8100 -m profiles/tiny-qwen3.5 --out cpu.yaml

      hybridserve step-profile --replica http://127.0.0.1:8100 --pd http://127.0.0.1:9000 -m /tmp/m60 \\
          --device cuda --unit "H200, 50 % of the SMs (MPS)" --max-num-seqs 1024 --max-num-batched-tokens 8192 \\
          --max-model-len 34816 --prefill-lens 1024,4096,8192,16384,32000 --batches 1,8,32,128 \\
          --decode-lens 1024,16384 --transfer-lens 1024,8192,32000 --out h200-sm50.yaml
    """
    from hybridserve.core.common.output_path import check_output_path
    from hybridserve.core.sizing.measure import MeasureRequest, measure
    from hybridserve.core.sizing.step_profile import (EngineLimits, load_step_profile, profile_dict,
                                                      write_step_profile)

    check_output_path(out, "--out")
    if (replica is None) == (steps_from is None):
        raise InputError("--replica / --steps-from: accepted: one of them (a server to measure the steps on, or a "
                         "profile whose steps to keep)")
    if steps_from is not None and not (pd or calibrate):
        raise InputError("--steps-from: accepted with --pd or --calibrate (what to measure on top of the steps)")
    if device not in ("cpu", "cuda"):
        raise InputError(f"--device {device}: accepted: cpu, cuda")
    request = MeasureRequest(
        replica_url=(replica or "").rstrip("/"), pd_url=pd.rstrip("/") if pd else None, model=model.resolve(), unit=unit,
        device=device, limits=EngineLimits(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                                           max_model_len=max_model_len),
        prefill_lens=_ints(prefill_lens, "--prefill-lens"), batches=_ints(batches, "--batches"),
        decode_lens=_ints(decode_lens, "--decode-lens"), decode_output=decode_output,
        transfer_lens=_ints(transfer_lens, "--transfer-lens"), repeats=repeats, num_blocks=num_blocks, tp=tp,
        name=name or out.stem, timeout_s=timeout, steps_from=load_step_profile(steps_from) if steps_from else None,
        calibrate=tuple(u.rstrip("/") for u in calibrate or ()))
    err_console.print("measuring (bench phases, one after another) ...", highlight=False)
    profile = measure(request)
    write_step_profile(profile, out)
    if as_json:
        print_json(profile_dict(profile))
        return
    from rich.table import Table

    table = Table(title=f"step profile {profile.name}: {profile.unit}, written to {out}")
    for column in ("observation", "measured ms", "fitted ms"):
        table.add_column(column, justify="left" if column == "observation" else "right")
    for row in profile.measured["fit"]:
        table.add_row(row["what"], f"{row['measured_s'] * 1e3:,.2f}", f"{row['fitted_s'] * 1e3:,.2f}")
    out_console.print(table)
    c = profile.coefficients
    out_console.print(f"step = {c.base_s * 1e3:.3f} ms + {c.token_s * 1e6:.3f} us/token + {c.seq_s * 1e3:.3f} ms/request"
                      f" + {c.attention_s * 1e9:.4f} ns/attention pair; first token + {c.http_s * 1e3:.2f} ms; "
                      f"{profile.num_blocks:,} blocks; load factors {profile.load_factors or 'none'}",
                      highlight=False)
