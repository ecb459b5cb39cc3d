"""Render a bench result: a rich table, a JSON-ready dict and a PNG (written to a temp file, then renamed)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from hybridserve.core.common.atomic_file import replaced_on_success
from hybridserve.transfer.xfer_bench import BenchResult


def result_dict(result: BenchResult) -> dict[str, Any]:
    data = asdict(result)
    for row, out in zip(result.rows, data["rows"], strict=True):
        out["is_tcp_fallback"] = row.is_tcp_fallback
    return data


def transport_cell(row: Any) -> str:
    """The row's data transport; a fall back to TCP is marked so that it is never read as a plain value."""
    if row.transport is None:
        return "-"
    return "[bold red]tcp FALLBACK[/]" if row.is_tcp_fallback else row.transport


def table(result: BenchResult) -> Any:
    from rich.table import Table

    title = (f"{result.model} TP {result.prefill_tp}->{result.decode_tp}, {result.memory.upper()}, "
             f"{result.backend} (block {result.block_size}, kernel block {result.kernel_block_size}, "
             f"page {result.page_size_bytes:,} B x {result.num_tensors} tensors)")
    out = Table(title=title)
    for name in ("prompt", "scheme", "blocks", "descs", "elements", "merged", "predicted", "MB", "prep ms",
                 "post ms", "xfer ms", "GB/s", "copy GB/s", "exact", "transport"):
        out.add_column(name, justify="left" if name in ("scheme", "blocks") else "right")
    for r in result.rows:
        out.add_row(f"{r.prompt_tokens:,}", r.scheme, r.allocation, f"{r.num_descriptors:,}", f"{r.num_elements:,}",
                    "-" if r.num_merged is None else f"{r.num_merged:,}", f"{r.predicted_descriptors:,}",
                    f"{r.num_bytes / 1e6:,.1f}", f"{r.prepare_ms:.2f}", f"{r.post_ms:.1f}", f"{r.transfer_ms:.1f}",
                    f"{r.gbps:.2f}", f"{r.copy_gbps:.2f}", "yes" if r.is_exact else "NO",
                    transport_cell(r))
    return out


def write_png(results: list[BenchResult], path: Path) -> None:
    """Transfer GB/s per prompt length, one bar per scheme/allocation, beside the in-process copy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4), squeeze=False)
    for ax, result in zip(axes[0], results, strict=True):
        prompts = sorted({r.prompt_tokens for r in result.rows})
        series = sorted({(r.scheme, r.allocation) for r in result.rows})
        width = 0.8 / (len(series) + 1)
        for i, key in enumerate(series):
            values = [next((r.gbps for r in result.rows if (r.scheme, r.allocation) == key
                            and r.prompt_tokens == p), 0.0) for p in prompts]
            ax.bar([x + i * width for x in range(len(prompts))], values, width, label=f"{key[0]} {key[1]}")
        copies = [max(r.copy_gbps for r in result.rows if r.prompt_tokens == p) for p in prompts]
        ax.bar([x + len(series) * width for x in range(len(prompts))], copies, width, label="in-process copy")
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(prompts))], [f"{p:,}" for p in prompts])
        ax.set_xlabel("prompt tokens")
        ax.set_ylabel("GB/s")
        ax.set_title(f"{result.model} TP{result.prefill_tp}->{result.decode_tp} {result.memory}", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with replaced_on_success(path, suffix=".png") as tmp:
            fig.savefig(tmp, dpi=110)
    finally:
        plt.close(fig)
