"""What `launch --dry-run` shows: per engine role the layout `plan` shows for the same settings, then the commands."""

from __future__ import annotations

import shlex
from typing import Any

from rich.table import Table

from hybridserve.cli.console import out_console
from hybridserve.cli.plan_render import format_bytes, layout_rows
from hybridserve.core.launch.launch_plan import LaunchPlan
from hybridserve.core.layout.plan_report import layout_dict


def access_lines(plan: LaunchPlan) -> list[str]:
    """Who may talk to the deployment (core/launch/keys.py), for the dry run: file names only, never a key."""
    topology, key = plan.topology, plan.engine_key_file
    sides = ", ".join(f"{i.host}:{i.side_channel_port}" for i in (*topology.prefill, *topology.decode))
    rest = (f"access: open to anyone who reaches them: the NIXL side channels ({sides}) and UCX's listeners on the "
            "engines' addresses; keep them on a private network") if sides else (
        "access: replicas have no KV connector: no NIXL side channel or UCX listener")
    if key is None:
        return ["access: open (no --api-key-file): the proxy and the engines answer anyone who reaches them", rest]
    front = ("open front door (no --api-key-file): the proxy answers anyone who reaches it" if plan.is_open else
             f"the proxy asks for the key in {topology.proxy.api_key_file} (Authorization: Bearer) on every path "
             "but /health and /metrics")
    where = (f"from {key}" if key.is_absolute() else
             "generated per deployment into engine.key in the run folder, mode 0600")
    return [f"access: {front}; the engines answer only the proxy (VLLM_API_KEY {where}; /health and /metrics "
            "stay open)", rest]


def launch_dict(plan: LaunchPlan) -> dict[str, Any]:
    key = plan.engine_key_file
    access = {"is_open": plan.is_open, "api_key_file": _path(plan.topology.proxy.api_key_file),
              "engine_key_file": _path(key), "is_engine_key_generated": key is not None and not key.is_absolute(),
              "lines": access_lines(plan)}
    return {"role": plan.role.value, "model": str(plan.topology.model), "vllm": plan.vllm.line,
            "warnings": list(plan.warnings), "access": access, "commands": [
        {"name": c.name, "role": c.role.value, "url": c.url, "argv": list(c.argv), "env": dict(c.env),
         "secret_env": {name: f"read from {path} at start" for name, path in c.secret_env},
         "gpus": list(c.gpus) if c.gpus is not None else None, "gpu_memory_utilization": c.gpu_memory_utilization,
         "sm_percent": c.sm_percent, "share": c.share,
         "block_size": c.cache.block_size if c.cache else None,
         "kernel_block_size": c.cache.kernel_block_size if c.cache else None,
         "layout": layout_dict(c.cache.layout) if c.cache else None,
         "num_blocks": c.cache.capacity.num_blocks if c.cache and c.cache.capacity else None,
         "async_scheduling": ({"is_on": c.async_scheduling.is_on, "reason": c.async_scheduling.reason}
                              if c.async_scheduling else None),
         "limits": _limits_dict(c.limits),
         "warmup": ({"prompt_tokens": list(c.warmup.prompt_tokens), "max_tokens": c.warmup.max_tokens,
                     "reason": c.warmup.reason} if c.warmup is not None else None)}
        for c in plan.commands]}


def _limits_dict(limits) -> dict[str, Any] | None:  # noqa: ANN001 (EngineLimits | None)
    """Each limit's value as written (None: no flag, vLLM's default) and why."""
    if limits is None:
        return None
    return {name: {"value": getattr(limits, name).value, "reason": getattr(limits, name).reason}
            for name in ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "enforce_eager")}


def _path(path) -> str | None:  # noqa: ANN001 (Path | None)
    return str(path) if path is not None else None


def render_dry_run(plan: LaunchPlan) -> None:
    engines = [c for c in plan.commands if c.cache is not None]
    if engines:
        out_console.print(_layout_table(plan, engines))
    for line in access_lines(plan):
        out_console.print(f"# {line}", highlight=False, markup=False, soft_wrap=True)
    for c in plan.commands:
        out_console.print(f"[bold]# {c.name}[/]  {c.url}", highlight=False)
        if c.share is not None:
            out_console.print(f"# share: {c.share}", highlight=False, markup=False, soft_wrap=True)
        if c.async_scheduling is not None:
            state = "on" if c.async_scheduling.is_on else "off"
            out_console.print(f"# async scheduling {state}: {c.async_scheduling.reason}", highlight=False, markup=False,
                              soft_wrap=True)
        for line in c.limits.lines() if c.limits is not None else ():
            out_console.print(f"# {line}", highlight=False, markup=False, soft_wrap=True)
        if c.warmup is not None:
            out_console.print(f"# {c.warmup.line()}", highlight=False, markup=False, soft_wrap=True)
        secrets = [f'{k}="$(cat {shlex.quote(str(path))})"' for k, path in c.secret_env]  # the file, not the key
        env = " ".join([*(f"{k}={shlex.quote(v)}" for k, v in c.env), *secrets])
        out_console.print(f"{env} \\\n  {shlex.join(c.argv)}\n", highlight=False, soft_wrap=True, markup=False)


def _layout_table(plan: LaunchPlan, engines: list) -> Table:  # noqa: ANN001 (RoleCommand)
    backend = engines[0].cache.layout.request.backend.value
    table = Table(title=f"{plan.topology.model_name}: layout per rank ({backend}), as `hybridserve plan` computes it")
    table.add_column("quantity")
    for c in engines:
        table.add_column(c.name, justify="right")
    columns = [layout_rows(c.cache.layout) for c in engines]
    for rows in zip(*columns):
        table.add_row(rows[0][0], *(value for _, value in rows))
    if all(c.cache.capacity for c in engines):
        table.add_row("KV cache per rank", *(format_bytes(c.cache.capacity.kv_cache_bytes) for c in engines))
        table.add_row("blocks", *(f"{c.cache.capacity.num_blocks:,}" for c in engines))
    return table
