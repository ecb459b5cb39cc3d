"""`hybridserve bench`: served TTFT, ITL and throughput of a P/D deployment beside one server, with decode's NIXL
stats and plan's prediction."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from hybridserve.cli.console import out_console, print_json
from hybridserve.cli.options import (
    JsonOpt, StartedBasePortOpt, StartedDeviceOpt, StartedEagerOpt, StartedGdnBackendOpt, StartedRunDirOpt,
    started_timeout_opt,
)

_TARGET = "URL of an OpenAI-compatible server, or a configuration bench starts: single-sync, single-async, pd-async, pd-sync"


def command(
    deployment: Annotated[str, typer.Option(help=f"{_TARGET}.")] = "pd-sync",
    baseline: Annotated[str, typer.Option(help=f"{_TARGET}; 'none' for no baseline.")] = "single-sync",
    control: Annotated[Optional[str], typer.Option(help="A/A control: a second baseline (the same configuration "
                                                   "started again, or another URL).")] = None,
    api_key_file: Annotated[Optional[Path], typer.Option(help="The deployment's front key (launch --api-key-file), "
                                                         "sent to it only.")] = None,
    metrics: Annotated[Optional[list[str]], typer.Option(help="Decode server URL whose /metrics has the NIXL "
                                                         "stats (repeatable; default: the proxy's decode "
                                                         "servers).")] = None,
    input_len: Annotated[list[str], typer.Option(help="Prompt tokens: N or MIN:MAX (uniform); repeat for one "
                                                 "phase per length.")] = ["1024"],
    output_len: Annotated[str, typer.Option(help="Output tokens: N or MIN:MAX (exact: ignore_eos).")] = "32",
    num_requests: Annotated[int, typer.Option(help="Requests per phase.")] = 8,
    concurrency: Annotated[Optional[int], typer.Option(help="Requests in flight (default 1: idle, one at a "
                                                       "time; with --request-rate: no cap).")] = None,
    request_rate: Annotated[Optional[float], typer.Option(help="Requests per second, Poisson arrivals "
                                                          "(seeded).")] = None,
    probes: Annotated[int, typer.Option(help="Probe requests sent one after another under the load; their "
                                        "TTFT is reported apart.")] = 0,
    probe_len: Annotated[int, typer.Option(help="Prompt tokens of each probe.")] = 32768,
    probe_output_len: Annotated[int, typer.Option(help="Output tokens of each probe.")] = 16,
    probe_after: Annotated[Optional[int], typer.Option(help="Send the probes once this many requests have "
                                                       "finished (default: a third of --num-requests).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of lengths and arrival times.")] = 0,
    prompt_seed: Annotated[Optional[int], typer.Option(help="Seed of the prompt ids (default: new each run, so "
                                                       "no server's prefix cache holds them).")] = None,
    model: Annotated[Optional[Path], typer.Option(help="Model folder: started configurations serve it; its "
                                                  "config gives the vocabulary and the prediction (default for "
                                                  "URLs: the folder the server loaded).")] = None,
    served_model: Annotated[Optional[str], typer.Option(help="Model name to ask URL endpoints for.")] = None,
    vocab_size: Annotated[Optional[int], typer.Option(help="Draw prompt ids below this (default: the config's "
                                                      "vocab_size).")] = None,
    fault: Annotated[Optional[str], typer.Option(help="Arm a fault in a started deployment's decode server "
                                                 "(tests): slow_decode, ...")] = None,
    device: StartedDeviceOpt = "cpu",
    max_model_len: Annotated[Optional[int], typer.Option(help="vLLM --max-model-len of started servers (default: "
                                                         "launch's: CUDA the model's, CPU 2048).")] = None,
    max_num_seqs: Annotated[Optional[int], typer.Option(help="vLLM --max-num-seqs of started servers (default: "
                                                        "launch's: CUDA vLLM's, CPU 8).")] = None,
    gdn_prefill_backend: StartedGdnBackendOpt = None,
    enforce_eager: StartedEagerOpt = None,
    allow_unlike: Annotated[bool, typer.Option("--allow-unlike", metavar="", help="Measure targets whose engine "
                                               "settings differ (marked above every number) instead of refusing.")] = False,
    gpus: Annotated[Optional[list[str]], typer.Option(help="GPUs a URL target holds, for tokens/s per GPU and its "
                                                      "memory share: N (every URL target) or ROLE=N, "
                                                      "repeatable.")] = None,
    slo_ttft: Annotated[Optional[float], typer.Option(help="Goodput's TTFT objective, ms.")] = None,
    slo_itl: Annotated[Optional[float], typer.Option(help="Goodput's ITL objective, ms: a request's mean ITL (vLLM "
                                                     "bench serve's TPOT).")] = None,
    base_port: StartedBasePortOpt = 8000,
    run_dir: StartedRunDirOpt = Path("runs"),
    timeout: started_timeout_opt(600) = None,  # type: ignore[valid-type]
    png: Annotated[Optional[Path], typer.Option(help="Write TTFT and ITL percentiles per target to this PNG.")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Also write the --json result to this file.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Drive a P/D deployment and a baseline with the same requests, one target at a time, and compare them.

    Like with like first: before it measures, bench reads every target's engine settings (max-num-seqs,
    max-model-len, memory share, eager or graphs, GDN prefill backend, async scheduling, dtypes) from vLLM's
    /metrics (vllm:cache_config_info), /v1/models, and for servers hybridserve launched (started here, or a live
    launch run under --run-dir) their flags and logs. Targets that differ, the P/D split itself aside (P and D of
    one deployment are one target; shares of a GPU are summed per GPU), are refused (exit 2, one line naming the
    setting) unless --allow-unlike, which measures them and marks the difference above every number. What it could
    not read for a target is named, never guessed.

    Prompts are random token ids (no tokenizer needed); every output is exactly --output-len tokens. Per phase:
    TTFT, ITL and end-to-end p50/p90/p99, request, output and total tokens/s, per GPU where the target's GPUs are
    known, goodput (DistServe's: requests/s within --slo-ttft and --slo-itl, a request's ITL being its mean, as
    vLLM bench serve's --goodput counts TPOT); for P/D, decode's NIXL transfers, descriptors, post and transfer
    time and bytes per transfer (its /metrics before and after the phase) beside plan's prediction. Exit 0, or 2
    when it could not run or refused.

    Examples:

      hybridserve bench --input-len 1024 --input-len 8192 --num-requests 10      # idle sweep, started servers

      hybridserve bench --deployment http://127.0.0.1:8000 --baseline http://127.0.0.1:8300 --model /tmp/m60 \\
          --device cuda --input-len 500:12000 --num-requests 48 --concurrency 16 --probes 3 --probe-after 16

      hybridserve bench --baseline single-sync --control single-sync --json > bench.json     # with an A/A control

      hybridserve bench --deployment http://127.0.0.1:8000 --baseline http://127.0.0.1:8300 --gpus 1 \\
          --slo-ttft 2000 --slo-itl 50 --allow-unlike     # URL targets on one GPU each, goodput, marked if unlike
    """
    from hybridserve.core.bench.lengths import parse_length
    from hybridserve.core.bench.load import make_load
    from hybridserve.core.bench.phase import PhaseSpec, ProbeSpec
    from hybridserve.core.bench.comparison import BenchRequest
    from hybridserve.core.common.fault_kind import parse_fault
    from hybridserve.core.common.output_path import check_output_path
    from hybridserve.core.launch.keys import read_key
    from hybridserve.core.bench.goodput import make_slo
    from hybridserve.core.bench.likeness.before_measuring import parse_gpus
    from hybridserve.core.supervise.start_phase import default_start_timeout
    from hybridserve.core.launch.topology import Device, EngineOptions

    for path, flag in ((png, "--png"), (out, "--out")):
        if path is not None:
            check_output_path(path, flag)
    load, outputs = make_load(concurrency, request_rate), parse_length(output_len, flag="--output-len")
    probe = None if probes == 0 else ProbeSpec(
        num_probes=probes, input_tokens=probe_len, output_tokens=probe_output_len,
        after_requests=num_requests // 3 if probe_after is None else probe_after)
    phases = tuple(PhaseSpec(load=load, num_requests=num_requests, input_len=parse_length(text, flag="--input-len"),
                             output_len=outputs, probe=probe) for text in input_len)
    engine = EngineOptions(gdn_prefill_backend=gdn_prefill_backend, is_enforce_eager=enforce_eager,
                           max_model_len=max_model_len, max_num_seqs=max_num_seqs)
    targets, where = _targets(deployment, baseline, control, metrics, parse_fault(fault)), Device.parse(device)
    request = BenchRequest(
        targets=targets, phases=phases, seed=seed,
        prompt_seed=prompt_seed, model=model, served_model=served_model, vocab_size=vocab_size, base_port=base_port,
        run_root=run_dir, num_cores=os.cpu_count() or 1, start_timeout_s=timeout or default_start_timeout(where),
        request_timeout_s=timeout or 600.0, device=where.value, engine=engine,
        api_key=read_key(api_key_file, what="--api-key-file") if api_key_file else None, allow_unlike=allow_unlike,
        gpus=parse_gpus(gpus, tuple(t.role for t in targets if t.target.url is not None)),
        slo=make_slo(slo_ttft, slo_itl))
    report = _run_with_progress(request)
    from hybridserve.cli.bench_render import render, report_dict, write_json

    if png is not None:
        from hybridserve.core.bench.figure import write_png
        write_png(report, png)
    if out is not None:
        write_json(out, report_dict(report))
    print_json(report_dict(report)) if as_json else render(out_console, report)


def _targets(deployment: str, baseline: str, control: str | None, metrics: list[str] | None, fault):  # noqa: ANN001, ANN202
    from hybridserve.core.bench.comparison import BenchTarget
    from hybridserve.core.common.errors import InputError
    from hybridserve.core.validate import parse_target

    for url in metrics or ():
        if not url.startswith(("http://", "https://")):
            raise InputError(f"--metrics {url}: accepted: an http(s):// URL of a decode server")
    out = [BenchTarget(role="deployment", target=parse_target(deployment, what="deployment", fault=fault),
                       metrics_urls=tuple(u.rstrip("/") for u in metrics or ()))]
    if baseline.strip().lower() != "none":
        out.append(BenchTarget(role="baseline", target=parse_target(baseline, what="baseline")))
    if control is not None:
        out.append(BenchTarget(role="control", target=parse_target(control, what="control")))
    return tuple(out)


def _run_with_progress(request):  # noqa: ANN001, ANN202
    from hybridserve.cli.phase_progress import run_with_phase_progress
    from hybridserve.core.bench.comparison import bench

    return run_with_phase_progress(lambda on_progress: bench(request, on_progress), before="the results")
