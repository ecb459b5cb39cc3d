"""Rendering of a bench report: one rich table per phase (targets side by side, ratios, plan), a dict for --json."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from hybridserve.cli.bench_settings_render import render_settings, settings_dict
from hybridserve.core.bench.client_stats import ClientSummary
from hybridserve.core.bench.comparison import BenchReport, PhaseResult
from hybridserve.core.bench.prediction import FIRST_REQUEST, FRESH_ASSUMPTION, Prediction
from hybridserve.core.bench.server_metrics import NixlStats
from hybridserve.core.common.atomic_file import write_text


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:,.1f}"


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or not b else f"{a / b:.2f}x"


def _client_rows(summary: ClientSummary, prefix: str = "") -> list[tuple[str, float | None, str]]:
    rows = [(f"{prefix}TTFT {p} ms", getattr(summary.ttft_s, p), "ms") for p in ("p50", "p90", "p99")]
    if not prefix:
        rows += [(f"ITL {p} ms", getattr(summary.itl_s, p), "ms") for p in ("p50", "p90", "p99")]
    rows += [(f"{prefix}E2E {p} ms", getattr(summary.e2e_s, p), "ms") for p in ("p50", "p90", "p99")]
    if not prefix:
        rows += [("requests/s", summary.request_throughput, "n"), ("output tokens/s", summary.output_throughput, "n"),
                 ("total tokens/s", summary.total_throughput, "n"), ("wall s", summary.wall_s, "n")]
        if summary.num_good is not None:
            rows.append(("goodput requests/s (within the SLO)", summary.goodput, "n"))
    return rows


def per_gpu(value: float | None, num_gpus: int | None) -> float | None:
    return value / num_gpus if value is not None and num_gpus else None


def _nixl_rows(stats: NixlStats | None, num_ok: int, plan: Prediction | None) -> list[tuple[str, str, str]]:
    """`num_ok`: answered requests and probes (each one moved its state over NIXL)."""
    if stats is None:
        return []
    per_request = stats.num_transfers / num_ok if num_ok else None
    rows = [("NIXL transfers (per answered request)", f"{stats.num_transfers} ({_num(per_request)})",
             "-" if plan is None else f"{plan.num_reads}"),
            ("descriptors / transfer", _num(stats.mean_descriptors, 1), _plan_descriptors(plan)),
            ("post ms / transfer", _ms(stats.mean_post_s), ""),
            ("transfer ms mean / p50 (buckets)", f"{_ms(stats.mean_xfer_s)} / {_ms(stats.p50_xfer_s)}", ""),
            ("MB / transfer", _num(None if stats.mean_bytes is None else stats.mean_bytes / 1e6, 3),
             "-" if plan is None else f"{plan.bytes / 1e6:,.3f}"),
            ("failed transfers / KV expired", f"{stats.num_failed_transfers} / {stats.num_kv_expired}", "")]
    if plan is not None and plan.unmerged_descriptors is not None:
        rows.insert(2, ("descriptor ids (unmerged) / fragmented bound", "",
                        f"{plan.unmerged_descriptors:,.0f} / {_num(plan.fragmented_descriptors, 0)}"))
    if plan is not None and plan.basis != FIRST_REQUEST:
        rows.insert(2, ("plan's descriptor basis", "", _plan_basis(plan)))
    return rows


def _plan_descriptors(plan: Prediction | None) -> str:
    """The plan cell beside the served mean: one value, or a range where the block ids are not followed."""
    if plan is None:
        return "-"
    if plan.is_range:
        return f"{plan.descriptors:,.1f} - {plan.descriptors_max:,.1f} (range)"
    flags = ([] if plan.is_served_count else ["ids"]) + ([FRESH_ASSUMPTION] if plan.basis == FRESH_ASSUMPTION else [])
    return f"{plan.descriptors:,.1f}" + (f" ({', '.join(flags)})" if flags else "")


def _plan_basis(plan: Prediction) -> str:
    if plan.is_range:
        return "range: a fresh server's first request to a run per block"
    if plan.fresh_descriptors is None:
        return plan.basis
    return f"{plan.basis} (first request on a fresh server: {plan.fresh_descriptors:,.1f})"


def render(console: Console, report: BenchReport) -> None:
    render_settings(console, report.settings, report.likeness)  # before any number
    head = Table(title=f"bench: {report.model}, prompt ids below {report.vocabulary.size:,} (seed {report.seed}, "
                       f"prompt seed {report.prompt_seed})")
    for name in ("role", "target", "url", "metrics from", "GPUs", "time s (start + phases)"):
        head.add_column(name, justify="right" if name.startswith(("time", "GPUs")) else "left")
    for t in report.targets:
        head.add_row(t.role, t.label, t.url, ", ".join(t.metrics_urls), "-" if t.num_gpus is None else str(t.num_gpus),
                     f"{t.elapsed_s:.1f}")
    console.print(head)
    for i, work in enumerate(report.phases):
        console.print(_phase_table(report, i, work.spec.name))


def _phase_table(report: BenchReport, index: int, name: str) -> Table:
    targets = report.targets
    phases = [t.phases[index] for t in targets]
    roles = [t.role for t in targets]
    plan = report.predictions[index]
    mean = f"; plan: mean over its {plan.mean_prompt_tokens:,.0f}-token mean prompts" if plan else ""
    slo = f"; goodput SLO: {report.slo.name}" if report.slo else ""
    unlike = "; UNLIKE targets (see above)" if report.likeness and not report.likeness.is_like else ""
    table = Table(title=f"phase {index + 1}: {name}, {report.phases[index].spec.num_requests} requests{mean}{slo}"
                        f"{unlike}")
    table.add_column("measure")
    for role in roles:
        table.add_column(role, justify="right")
    pairs = [(a, "baseline") for a in ("deployment", "control") if a in roles and "baseline" in roles]
    for a, b in pairs:
        table.add_column(f"{a} / {b}", justify="right")
    table.add_column("plan", justify="right")
    table.add_row("requests ok / sent", *[f"{p.client.num_ok} / {p.client.num_sent}" for p in phases],
                  *["" for _ in pairs], "")
    _add_client(table, phases, roles, pairs, lambda p: p.client, "")
    for label, pick in (("output tokens/s per GPU", lambda s: s.output_throughput),
                        ("total tokens/s per GPU", lambda s: s.total_throughput)):
        values = [per_gpu(pick(p.client), t.num_gpus) for p, t in zip(phases, targets)]
        table.add_row(label, *[_num(v) for v in values],
                      *[_ratio(values[roles.index(a)], values[roles.index(b)]) for a, b in pairs], "")
    if any(p.probes for p in phases):
        table.add_row("probes ok / sent", *[f"{p.probes.num_ok} / {p.probes.num_sent}" if p.probes else "-"
                                             for p in phases], *["" for _ in pairs], "")
        _add_client(table, phases, roles, pairs, lambda p: p.probes, "probe ")
    _add_engine(table, phases, roles, pairs)
    for role, phase in zip(roles, phases):
        answered = phase.client.num_ok + (phase.probes.num_ok if phase.probes else 0)
        for label, value, planned in _nixl_rows(phase.nixl, answered, plan):
            table.add_row(f"{role}: {label}", *[value if r == role else "" for r in roles],
                          *["" for _ in pairs], planned)
    return table


ENGINE_ROWS = (("engines: queue, mean ms", "mean_queue_s"),
               ("engines: prefill (scheduled to token 1), mean ms", "mean_prefill_s"),
               ("engines: API server TTFT, mean ms", "mean_server_ttft_s"))


def _add_engine(table: Table, phases: list[PhaseResult], roles: list[str], pairs: list) -> None:
    """The prompt-computing engines' own timings (core/bench/engine_timing.py), side by side with their ratios."""
    if not any(p.engine for p in phases):
        return
    for label, field in ENGINE_ROWS:
        values = [getattr(p.engine, field) if p.engine else None for p in phases]
        table.add_row(label, *[_ms(v) for v in values],
                      *[_ratio(values[roles.index(a)], values[roles.index(b)]) for a, b in pairs], "")


def _add_client(table: Table, phases: list[PhaseResult], roles: list[str], pairs: list, pick, prefix: str) -> None:  # noqa: ANN001
    template = next(pick(p) for p in phases if pick(p) is not None)
    for i, (label, _, unit) in enumerate(_client_rows(template, prefix)):
        values = [(_client_rows(pick(p), prefix)[i][1] if pick(p) else None) for p in phases]
        cells = [_ms(v) if unit == "ms" else _num(v) for v in values]
        ratios = [_ratio(values[roles.index(a)], values[roles.index(b)]) for a, b in pairs]
        table.add_row(label, *cells, *ratios, "")


def report_dict(report: BenchReport) -> dict[str, Any]:
    """The whole report, records included (times in seconds)."""
    return {
        "model": report.model, "vocab_size": report.vocabulary.size, "vocab_source": report.vocabulary.source,
        "seed": report.seed, "prompt_seed": report.prompt_seed, "elapsed_s": report.elapsed_s,
        "settings": settings_dict(report.settings, report.likeness), "slo": asdict(report.slo) if report.slo else None,
        "phases": [{"name": w.spec.name, "load": asdict(w.spec.load), "num_requests": w.spec.num_requests,
                    "input_len": str(w.spec.input_len), "output_len": str(w.spec.output_len),
                    "probe": asdict(w.spec.probe) if w.spec.probe else None, "input_lens": list(w.input_lens),
                    "output_lens": list(w.output_lens), "offsets_s": list(w.offsets_s),
                    "prediction": asdict(p) if p else None, "probe_prediction": asdict(q) if q else None}
                   for w, p, q in zip(report.phases, report.predictions, report.probe_predictions)],
        "targets": [{"role": t.role, "label": t.label, "url": t.url, "metrics_urls": list(t.metrics_urls),
                     "run_dir": str(t.run_dir) if t.run_dir else None, "elapsed_s": t.elapsed_s,
                     "num_gpus": t.num_gpus, "phases": [_phase_dict(p, t.num_gpus) for p in t.phases]}
                    for t in report.targets],
    }


def _summary_dict(summary: ClientSummary | None, num_gpus: int | None = None) -> dict[str, Any] | None:
    if summary is None:
        return None
    out = asdict(summary)
    out.update(request_throughput=summary.request_throughput, output_throughput=summary.output_throughput,
               total_throughput=summary.total_throughput, goodput=summary.goodput,
               output_throughput_per_gpu=per_gpu(summary.output_throughput, num_gpus),
               total_throughput_per_gpu=per_gpu(summary.total_throughput, num_gpus))
    return out


def _phase_dict(phase: PhaseResult, num_gpus: int | None = None) -> dict[str, Any]:
    return {"client": _summary_dict(phase.client, num_gpus), "probes": _summary_dict(phase.probes),
            "nixl": asdict(phase.nixl) if phase.nixl else None,
            "engine": asdict(phase.engine) if phase.engine else None,
            "records": [asdict(r) for r in phase.records]}


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Written to a temporary file beside `path`, then renamed: never half a file."""
    write_text(path, json.dumps(data, indent=2, default=str))
