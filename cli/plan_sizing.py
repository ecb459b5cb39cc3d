"""`plan --gpus PROFILE:N`: aggregated or xPyD for a workload, SLOs and N GPUs; parse, call core/sizing, render."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from hybridserve.cli.console import out_console
from hybridserve.core.common.errors import InputError
from hybridserve.core.sizing.recommend import Sizing, SizingRequest, size

FLAGS = ("--input-len", "--output-len", "--rate", "--slo-ttft", "--slo-itl")


def parse_gpus(text: str) -> tuple[str, int]:
    """'h200-sm50:2' or 'path/to/profile.yaml:4' -> (profile reference, count)."""
    ref, _, count = text.rpartition(":")
    if not ref or not count.isdigit() or int(count) < 1:
        raise InputError(f"--gpus {text!r}: accepted: PROFILE:COUNT, a step profile (a shipped name or a file of "
                         "hybridserve step-profile) and how many of its units, e.g. cpu-core:2")
    return ref, int(count)


def run_sizing(*, model: str, gpus: str, input_len: str | None, output_len: str | None, rate: float | None,
               slo_ttft: float | None, slo_itl: float | None, num_requests: int, seed: int, tps: list[int],
               policy: str, is_searching: bool) -> Sizing:
    from hybridserve.core.launch.topology import RoutingPolicy
    from hybridserve.core.model.profiles import load_model
    from hybridserve.core.sizing.step_profile import load_step_profile
    from hybridserve.core.sizing.workload import make_slo, make_workload

    missing = [f for f, v in zip(FLAGS, (input_len, output_len, rate, slo_ttft, slo_itl)) if v is None]
    if missing:
        raise InputError(f"--gpus needs the workload and SLOs: {', '.join(missing)} missing; accepted: e.g. "
                         "--input-len 500:2000 --output-len 256:1024 --rate 4 --slo-ttft 1000 --slo-itl 50 (ms)")
    ref, count = parse_gpus(gpus)
    return size(SizingRequest(model=load_model(model), profile=load_step_profile(ref), num_units=count,
                              workload=make_workload(input_len, output_len, rate, num_requests=num_requests,
                                                     seed=seed),
                              slo=make_slo(slo_ttft / 1e3, slo_itl / 1e3), tps=tuple(tps), policy=RoutingPolicy.parse(policy),
                              is_searching=is_searching))


def sizing_dict(sizing: Sizing) -> dict[str, Any]:
    request = sizing.request
    return {
        "profile": request.profile.name, "unit": request.profile.unit, "num_units": request.num_units,
        "model": request.model.name, "workload": {"input_len": str(request.workload.input_len),
                                                  "output_len": str(request.workload.output_len),
                                                  "rate": request.workload.rate,
                                                  "num_requests": request.workload.num_requests},
        "slo": {"ttft_s": request.slo.ttft_s, "itl_s": request.slo.itl_s, "attainment": request.slo.attainment},
        "recommended": sizing.recommended.candidate.name, "is_prediction": True,
        "beyond_measured": list(sizing.workload_notes) + list(sizing.recommended.beyond_measured),
        "candidates": [{"name": r.candidate.name, "num_units": r.candidate.num_units,
                        "is_slo_met": r.at_rate.is_slo_met, "goodput": r.at_rate.goodput,
                        "goodput_per_unit": r.at_rate.goodput_per_unit, "attainment": r.at_rate.attainment,
                        "output_tokens_per_s": r.at_rate.output_tokens_per_s,
                        "ttft_p50_s": r.at_rate.ttft_p50_s, "ttft_p90_s": r.at_rate.ttft_p90_s,
                        "itl_p50_s": r.at_rate.itl_p50_s, "itl_p90_s": r.at_rate.itl_p90_s,
                        "max_slo_rate": r.max_slo_rate, "preemptions": r.num_preemptions,
                        "beyond_measured": list(r.beyond_measured)} for r in sizing.results],
        "skipped": [{"name": n, "why": w} for n, w in sizing.skipped]}


def render_sizing(sizing: Sizing) -> None:
    r = sizing.request
    table = Table(title=f"plan (a prediction): {r.model.name} on {r.num_units} x {r.profile.unit}; in "
                        f"{r.workload.input_len}, out {r.workload.output_len}, {r.workload.rate:g} req/s; SLO TTFT "
                        f"{r.slo.ttft_s * 1e3:g} ms, ITL {r.slo.itl_s * 1e3:g} ms ({r.slo.attainment:.0%} of requests)")
    for column in ("candidate", "SLO met", "goodput req/s", "per unit", "out tok/s", "TTFT p50/p90 ms",
                   "ITL p50/p90 ms", "max rate in SLO", "note"):
        table.add_column(column, justify="left" if column in ("candidate", "note") else "right")
    for i, result in enumerate(sizing.results):
        s = result.at_rate
        itl = "-" if s.itl_p50_s is None else f"{s.itl_p50_s * 1e3:,.1f} / {s.itl_p90_s * 1e3:,.1f}"
        top = "-" if result.max_slo_rate is None else f"{result.max_slo_rate:,.2f}"
        note = "; ".join((["recommended"] if i == 0 else []) + list(result.beyond_measured)
                         + ([f"{result.num_preemptions} preemptions"] if result.num_preemptions else []))
        table.add_row(result.candidate.name, "yes" if s.is_slo_met else f"no ({s.attainment:.0%})",
                      f"{s.goodput:,.2f}", f"{s.goodput_per_unit:,.2f}", f"{s.output_tokens_per_s:,.0f}",
                      f"{s.ttft_p50_s * 1e3:,.0f} / {s.ttft_p90_s * 1e3:,.0f}", itl, top, note)
    out_console.print(table)
    best = sizing.recommended
    verdict = "meets" if best.at_rate.is_slo_met else "misses (no candidate meets it)"
    out_console.print(f"recommended: {best.candidate.name}; it {verdict} the SLO at {r.workload.rate:g} req/s",
                      highlight=False)
    for note in sizing.workload_notes:
        out_console.print(f"beyond what the profile measured: {note}", highlight=False, markup=False)
    for name, why in sizing.skipped:
        out_console.print(f"skipped {name}: {why}", highlight=False, markup=False)
