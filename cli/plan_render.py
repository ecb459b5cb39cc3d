"""Rich tables for `plan`: one plan in detail, or a grid of plans as one summary table."""

from __future__ import annotations

from rich.table import Table

from hybridserve.cli.console import out_console
from hybridserve.core.layout.rank_layout import RankLayout
from hybridserve.core.layout.plan import Plan
from hybridserve.core.launch.seqs_fit import SeqsFit, vllm_default_max_num_seqs


def format_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:,.2f} {unit}"
    return f"{n:,} B"


def layout_rows(layout: RankLayout) -> list[tuple[str, str]]:
    gdn = layout.gdn
    groups = ", ".join(f"{g.kind.value}[{len(g.layers)}]" for g in layout.groups.groups)
    return [
        ("TP", str(layout.request.tp)),
        ("cache dtypes kv / conv / ssm", f"{layout.dtypes.kv.value} / {layout.dtypes.conv.value} / "
                                          f"{layout.dtypes.ssm.value}"),
        ("attention bytes / token / layer", f"{layout.attention.bytes_per_token:,}"),
        ("conv state bytes", f"{gdn.conv_state_bytes:,}" if gdn else "-"),
        ("SSM state bytes", f"{gdn.ssm_state_bytes:,}" if gdn else "-"),
        ("GDN page bytes (real)", f"{gdn.real_page_size_bytes:,}" if gdn else "-"),
        ("block size (tokens)", f"{layout.block_size:,}"),
        ("page size bytes", f"{layout.page_size_bytes:,}"),
        ("GDN padding", f"{layout.padding_percent:.2f} %"),
        ("kernel block x per block", f"{layout.kernel_block_size} x {layout.kernel_blocks_per_block}"),
        ("shared tensors T", str(layout.num_tensors)),
        ("groups", groups),
    ]


def state_block_note(plan: Plan) -> str | None:
    """A hybrid model's sequence ceiling on CUDA: vLLM captures no graphs past it; launch's verdict (seqs_fit.py)."""
    if plan.capacity is None or plan.request.budget is None or plan.prefill.gdn is None:
        return None
    blocks = plan.capacity.num_blocks
    if blocks < 1:
        return "none: the weights leave no KV cache at this share"
    fit = SeqsFit(vllm_default=vllm_default_max_num_seqs(plan.request.budget.device_memory_bytes, None),
                  num_blocks=blocks)
    verdict = "fits" if fit.cap is None else f"exceeds them: launch caps --max-num-seqs at {fit.cap:,}"
    return f"at most {blocks:,} (vLLM's default {fit.vllm_default:,} {verdict})"


def render_plan(plan: Plan) -> None:
    model = plan.request.layout.model
    table = Table(title=f"{model.name}: layout per rank ({plan.request.layout.backend.value})")
    table.add_column("quantity")
    table.add_column("prefill", justify="right")
    if plan.decode is not plan.prefill:
        table.add_column("decode", justify="right")
    rows = zip(layout_rows(plan.prefill), layout_rows(plan.decode))
    for (name, p), (_, d) in rows:
        table.add_row(name, p, *([d] if plan.decode is not plan.prefill else []))
    if plan.capacity:
        cap = plan.capacity
        table.add_row("GPU share (--gpu-memory-utilization)", f"{plan.request.budget.gpu_memory_utilization:g}")
        table.add_row("weights per rank (est.)", format_bytes(cap.weights_bytes))
        table.add_row("KV cache per rank", format_bytes(cap.kv_cache_bytes))
        table.add_row("blocks", f"{cap.num_blocks:,}")
        seqs = state_block_note(plan)
        if seqs:
            table.add_row("sequences (one GDN state block each)", seqs)
    out_console.print(table)
    out_console.print(_request_table(plan))


def format_count(n: float) -> str:
    """A count that may be a mean over requests (served.py): one decimal only when it has one."""
    return f"{n:,.0f}" if abs(n - round(n)) < 0.05 else f"{n:,.1f}"


def _request_table(plan: Plan) -> Table:
    served = plan.request.served
    table = Table(title="per request, per decode rank (N-1 tokens move with GDN layers; padding never moves)",
                  caption=f"descs vLLM: posted after NIXL's merge on a fresh server (mean of {served.repeats} "
                          f"requests a length after {served.num_warmup} warm-up); unmerged: the ids vLLM hands "
                          "NIXL; fragmented: a run per block")
    for col in ("prompt", "reads", "bytes vLLM", "bytes ours", "descs vLLM", "unmerged", "fragmented",
                f"descs ours ({plan.request.num_runs} run)", "NIXL elements ours", "saved",
                "fit (vLLM's concurrency)"):
        table.add_column(col, justify="right")
    for r in plan.requests:
        table.add_row(f"{r.prompt_tokens:,}", str(r.vllm.num_reads), format_bytes(r.vllm.total_bytes),
                      format_bytes(r.ours.total_bytes), format_count(r.vllm.served_descriptors),
                      f"{r.vllm.unmerged_descriptors:,}", f"{r.vllm.fragmented_descriptors:,}",
                      f"{r.ours.total_descriptors:,}", f"{r.ours.nixl_elements:,}",
                      f"{r.vllm.served_descriptors / max(1, r.ours.total_descriptors):.1f}x",
                      "-" if r.max_requests is None else f"{r.max_requests:,} ({r.vllm_max_concurrency:.2f}x)")
    return table


def render_plans(plans: list[Plan]) -> None:
    if len(plans) == 1:
        render_plan(plans[0])
        return
    table = Table(title="plan grid (per rank; per request per decode rank)")
    for col in ("model", "TP", "block", "kernel", "page", "pad %", "prompt", "descs vLLM", "unmerged", "fragmented",
                "descs ours", "bytes", "fit"):
        table.add_column(col, justify="right")
    for plan in plans:
        for r in plan.requests:
            table.add_row(plan.request.layout.model.name, str(plan.prefill.request.tp), str(plan.prefill.block_size),
                          str(plan.prefill.kernel_block_size), format_bytes(plan.prefill.page_size_bytes),
                          f"{plan.prefill.padding_percent:.2f}", f"{r.prompt_tokens:,}",
                          format_count(r.vllm.served_descriptors), f"{r.vllm.unmerged_descriptors:,}",
                          f"{r.vllm.fragmented_descriptors:,}", f"{r.ours.total_descriptors:,}",
                          format_bytes(r.vllm.total_bytes),
                          "-" if r.max_requests is None else f"{r.max_requests:,}")
    out_console.print(table)
