"""What `launch --dry-run` shows: per engine role the layout `plan` shows for the same settings, then the commands."""

from __future__ import annotations

import shlex
from typing import Any

from rich.table import Table

from hybridserve.cli.console import out_console
from hybridserve.cli.plan_render import format_bytes, layout_rows
from hybridserve.core.launch.plan import LaunchPlan
from hybridserve.core.layout.plan_report import layout_dict


def launch_dict(plan: LaunchPlan) -> dict[str, Any]:
    return {"role": plan.role.value, "model": str(plan.topology.model), "vllm": plan.vllm.line,
            "warnings": list(plan.warnings), "commands": [
        {"name": c.name, "role": c.role.value, "url": c.url, "argv": list(c.argv), "env": dict(c.env),
         "gpus": list(c.gpus) if c.gpus is not None else None, "gpu_memory_utilization": c.gpu_memory_utilization,
         "block_size": c.cache.block_size if c.cache else None,
         "kernel_block_size": c.cache.kernel_block_size if c.cache else None,
         "layout": layout_dict(c.cache.layout) if c.cache else None,
         "num_blocks": c.cache.capacity.num_blocks if c.cache and c.cache.capacity else None,
         "async_scheduling": ({"is_on": c.async_scheduling.is_on, "reason": c.async_scheduling.reason}
                              if c.async_scheduling else None)}
        for c in plan.commands]}


def render_dry_run(plan: LaunchPlan) -> None:
    engines = [c for c in plan.commands if c.cache is not None]
    if engines:
        out_console.print(_layout_table(plan, engines))
    for c in plan.commands:
        out_console.print(f"[bold]# {c.name}[/]  {c.url}", highlight=False)
        if c.async_scheduling is not None:
            state = "on" if c.async_scheduling.is_on else "off"
            out_console.print(f"# async scheduling {state}: {c.async_scheduling.reason}", highlight=False, markup=False,
                              soft_wrap=True)
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in c.env)
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
