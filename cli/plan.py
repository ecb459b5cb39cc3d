"""`hybridserve plan`: how vLLM lays out KV cache and GDN state, and what one request's transfer costs."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from hybridserve.cli.console import print_json
from hybridserve.cli.options import DtypeOpt, JsonOpt, YamlOpt
from hybridserve.cli.plan_render import render_plans
from hybridserve.core.common.errors import InputError
from hybridserve.core.common.numbers import gib_to_bytes
from hybridserve.core.layout.attention_backend import AttentionBackend
from hybridserve.core.layout.capacity import MemoryBudget, VLLM_GPU_MEMORY_UTILIZATION
from hybridserve.core.layout.plan import PlanRequest, make_plan
from hybridserve.core.layout.plan_report import plan_dict
from hybridserve.core.layout.settings import CacheSettings, layout_request
from hybridserve.core.model.dtypes import parse_optional
from hybridserve.core.model.profiles import device_memory_bytes, load_model, model_profile_names


def role_share(total: float, roles_per_gpu: int) -> float:
    """One role's --gpu-memory-utilization when `roles_per_gpu` servers share a GPU (launch's split)."""
    from hybridserve.core.launch.gpu_shares import memory_shares

    if roles_per_gpu < 1:
        raise InputError(f"--roles-per-gpu {roles_per_gpu}: accepted: 1 or more")
    if roles_per_gpu == 1:
        return total  # one server: vLLM's own meaning, any value in (0, 1]
    return memory_shares([(f"role-{i}", (0,)) for i in range(roles_per_gpu)], total=total)["role-0"]


def command(
    model: Annotated[list[str], typer.Option("--model", "-m", help="Profile name, config.json or model folder; "
                                              "repeat it, or 'all' for every shipped profile.")],
    tp: Annotated[list[int], typer.Option(help="Tensor-parallel size of the prefill side; repeat for a grid.")] = [1],
    decode_tp: Annotated[Optional[int], typer.Option(help="Decode TP when it differs from --tp.")] = None,
    dtype: DtypeOpt = "auto",
    kv_cache_dtype: DtypeOpt = "auto",
    mamba_cache_dtype: DtypeOpt = "auto",
    mamba_ssm_cache_dtype: DtypeOpt = "auto",
    block_size: Annotated[Optional[int], typer.Option(help="vLLM --block-size (default: 128 for cpu_attn, else 16).")] = None,
    attention_backend: Annotated[str, typer.Option(help="flash_attn, flashinfer, triton or cpu_attn.")] = "flash_attn",
    num_speculative_tokens: Annotated[int, typer.Option(help="Speculative tokens (MTP).")] = 0,
    prompt_len: Annotated[list[int], typer.Option(help="Prompt length in tokens; repeat it.")] = [1024, 8192, 32768],
    runs: Annotated[int, typer.Option(help="Contiguous runs a request's blocks come in (our scheme).")] = 1,
    memory: Annotated[Optional[str], typer.Option(help="Device memory: GiB or h100, h200, b200, gb200.")] = None,
    gpu_memory_utilization: Annotated[float, typer.Option(help="vLLM --gpu-memory-utilization (with "
                                                          "--roles-per-gpu: split among the roles).")] = VLLM_GPU_MEMORY_UTILIZATION,
    roles_per_gpu: Annotated[int, typer.Option(help="vLLM servers sharing one GPU (prefill + decode on one "
                                               "GPU: 2); capacity is per share, as launch splits it.")] = 1,
    weights_gib: Annotated[Optional[float], typer.Option(help="Weights per rank in GiB (default: estimate).")] = None,
    reserved_gib: Annotated[float, typer.Option(help="Activations and graphs per rank, GiB.")] = 0.0,
    no_hybrid_allocator: Annotated[bool, typer.Option(help="Model vLLM without the hybrid KV cache "
                                                      "manager (attention-only models).")] = False,
    gpus: Annotated[Optional[str], typer.Option(help="Sizing: PROFILE:N, N units of a step profile (shipped name "
                                                "or file), e.g. cpu-core:2; aggregated or xPyD?")] = None,
    input_len: Annotated[Optional[str], typer.Option(help="Sizing: prompt tokens, N or MIN:MAX.")] = None,
    output_len: Annotated[Optional[str], typer.Option(help="Sizing: output tokens, N or MIN:MAX.")] = None,
    rate: Annotated[Optional[float], typer.Option(help="Sizing: arrival rate, requests/s (Poisson).")] = None,
    slo_ttft: Annotated[Optional[float], typer.Option(help="Sizing: TTFT SLO in ms (as bench's; 90 % of requests).")] = None,
    slo_itl: Annotated[Optional[float], typer.Option(help="Sizing: ITL SLO in ms, a request's mean (bench's).")] = None,
    num_requests: Annotated[int, typer.Option(help="Sizing: requests simulated per rate.")] = 200,
    seed: Annotated[int, typer.Option(help="Sizing: seed of lengths and arrivals (bench's).")] = 0,
    policy: Annotated[str, typer.Option(help="Sizing: the proxy's policy.")] = "least_outstanding",
    no_search: Annotated[bool, typer.Option("--no-search", help="Sizing: skip the highest rate in SLO.")] = False,
    as_json: JsonOpt = False,
    as_yaml: YamlOpt = False,
) -> None:
    """Plan the KV cache and GDN state layout of vLLM, capacity, and per-request NIXL transfer cost.

    Examples:

      hybridserve plan -m qwen3.5-397b-a17b --mamba-ssm-cache-dtype bfloat16 --prompt-len 8192

      hybridserve plan -m qwen3.5-0.8b --block-size 128 --tp 1 --tp 4 --memory h200

      hybridserve plan -m all --tp 1 --tp 2 --tp 4 --tp 8 --json

      hybridserve plan -m profiles/tiny-qwen3.5 --gpus cpu-core:2 --input-len 1000:1800 --output-len 16:64 \
          --rate 4 --slo-ttft 500 --slo-itl 50          # sizing: aggregated replicas or xPyD (docs/sizing.md)
    """
    if gpus is not None:
        from hybridserve.cli.plan_sizing import render_sizing, run_sizing, sizing_dict

        sizing = run_sizing(model=model[0], gpus=gpus, input_len=input_len, output_len=output_len, rate=rate,
                            slo_ttft=slo_ttft, slo_itl=slo_itl, num_requests=num_requests, seed=seed,
                            tps=tp if tp != [1] else [], policy=policy, is_searching=not no_search)
        print_json(sizing_dict(sizing)) if as_json else render_sizing(sizing)
        return
    names = model_profile_names() if model == ["all"] else model
    budget = None
    if memory is not None:
        budget = MemoryBudget(device_memory_bytes=device_memory_bytes(memory),
                              gpu_memory_utilization=role_share(gpu_memory_utilization, roles_per_gpu),
                              weights_bytes=(None if weights_gib is None
                                             else gib_to_bytes(weights_gib, "--weights-gib")),
                              reserved_bytes=gib_to_bytes(reserved_gib, "--reserved-gib"))
    settings = CacheSettings(
        attention_backend=AttentionBackend.parse(attention_backend),
        model_dtype=parse_optional(dtype, what="--dtype"), block_size=block_size,
        kv_cache_dtype=parse_optional(kv_cache_dtype, what="--kv-cache-dtype"),
        mamba_cache_dtype=parse_optional(mamba_cache_dtype, what="--mamba-cache-dtype"),
        mamba_ssm_cache_dtype=parse_optional(mamba_ssm_cache_dtype, what="--mamba-ssm-cache-dtype"),
        num_speculative_tokens=num_speculative_tokens, hybrid_allocator=not no_hybrid_allocator)
    plans = []
    for name in names:
        spec = load_model(name)
        for size in tp:
            layout = layout_request(spec, size, settings)
            plans.append(make_plan(PlanRequest(layout=layout, decode_tp=decode_tp, prompt_tokens=tuple(prompt_len),
                                               num_runs=runs, budget=budget)))
    if as_json and as_yaml:
        raise InputError("--json and --yaml: accepted: one of them")
    data = [plan_dict(p) for p in plans]
    if as_json:
        print_json(data[0] if len(data) == 1 else data)
    elif as_yaml:
        import yaml
        typer.echo(yaml.safe_dump(data[0] if len(data) == 1 else data, sort_keys=False), nl=False)
    else:
        render_plans(plans)
