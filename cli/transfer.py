"""`hybridserve transfer bench`: what moving one request's KV cache and GDN state costs over NIXL here."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from hybridserve.cli.console import err_console, out_console, print_json
from hybridserve.cli.error_exit import guarded
from hybridserve.cli.help import HelpCommand, HelpGroup
from hybridserve.cli.options import JsonOpt, ModelOpt
from hybridserve.core.common.choices import parse_choice

app = typer.Typer(cls=HelpGroup, help="NIXL transfer of KV cache and GDN state between local rank processes.",
                  no_args_is_help=True, add_completion=False)


class _Schemes(enum.Enum):
    """--scheme: one of the descriptor schemes, or both."""

    VLLM = "vllm"
    OURS = "ours"
    BOTH = "both"


def bench(
    model: ModelOpt,
    prefill_tp: Annotated[int, typer.Option(help="Prefill ranks (processes).")] = 1,
    decode_tp: Annotated[int, typer.Option(help="Decode ranks (processes).")] = 1,
    prompt_len: Annotated[list[int], typer.Option(help="Prompt length in tokens; repeat it.")] = [1024, 8192, 32768],
    scheme: Annotated[str, typer.Option(help="vllm, ours or both.")] = "both",
    memory: Annotated[str, typer.Option(help="dram or vram (CUDA).")] = "dram",
    requests: Annotated[int, typer.Option(help="Requests per scheme and allocation (contiguous, fragmented).")] = 2,
    attention_backend: Annotated[str, typer.Option(help="flash_attn, flashinfer or triton.")] = "flashinfer",
    block_size: Annotated[Optional[int], typer.Option(help="vLLM --block-size.")] = None,
    mamba_ssm_cache_dtype: Annotated[str, typer.Option(help="auto, bfloat16 or float32.")] = "auto",
    num_speculative_tokens: Annotated[int, typer.Option(help="Speculative tokens (MTP).")] = 0,
    timeout: Annotated[float, typer.Option(help="Seconds one request's transfer may take.")] = 60.0,
    png: Annotated[Optional[Path], typer.Option(help="Also write a bar chart of GB/s here.")] = None,
    ucx_log: Annotated[Optional[Path], typer.Option(help="Keep the rank processes' UCX output (its protocol "
                                                    "report names each transport) in this file.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Move requests between prefill and decode rank processes over NIXL; check every byte; time both schemes.

    Examples:

      hybridserve transfer bench -m qwen3.5-397b-a17b --mamba-ssm-cache-dtype bfloat16

      hybridserve transfer bench -m qwen3.5-0.8b --prefill-tp 2 --decode-tp 1 --prompt-len 4096 --json

      hybridserve transfer bench -m qwen3.5-397b-a17b --memory vram --png transfer.png
    """
    from hybridserve.core.layout.attention_backend import AttentionBackend
    from hybridserve.core.layout.descriptors import Scheme
    from hybridserve.core.model.dtypes import parse_optional
    from hybridserve.core.model.profiles import load_model
    from hybridserve.transfer.xfer_bench import BenchRequest, Memory, num_steps, run_bench

    picked = parse_choice(_Schemes, scheme, what="--scheme")
    request = BenchRequest(
        model=load_model(model), prefill_tp=prefill_tp, decode_tp=decode_tp, prompt_tokens=tuple(prompt_len),
        schemes=tuple(Scheme) if picked is _Schemes.BOTH else (Scheme(picked.value),),
        memory=parse_choice(Memory, memory, what="--memory"), num_requests=requests,
        backend=AttentionBackend.parse(attention_backend), block_size=block_size,
        ssm_dtype=parse_optional(mamba_ssm_cache_dtype, what="--mamba-ssm-cache-dtype"),
        num_speculative_tokens=num_speculative_tokens, timeout_s=timeout, ucx_log=ucx_log)
    from rich.progress import Progress

    with Progress(console=err_console, transient=True) as progress:
        task = progress.add_task("transfers", total=num_steps(request))
        result = run_bench(request, on_step=lambda tag: progress.advance(task))
    from hybridserve.transfer import report

    if png is not None:
        report.write_png([result], png)
    if as_json:
        print_json(report.result_dict(result))
    else:
        out_console.print(report.table(result))


app.command("bench", cls=HelpCommand)(guarded(bench))
