"""Time one backend setting: warm-up, then one timed call per repetition, cycling through several input sets so
that caches do not flatter small shapes. CUDA events on GPU (per call, read after one sync), perf_counter on CPU."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True, kw_only=True)
class TimingPlan:
    num_warmup: int = 3
    max_reps: int = 20
    min_reps: int = 3
    max_seconds: float = 1.0  # per setting, after warm-up: slow settings get fewer repetitions


def time_calls(calls: list[Callable[[], object]], device: torch.device, plan: TimingPlan) -> list[float]:
    """Milliseconds per call; `calls[i]` runs the kernel on input set i."""
    for i in range(plan.num_warmup):
        calls[i % len(calls)]()
    if device.type == "cuda":
        return _time_cuda(calls, plan)
    samples: list[float] = []
    started = time.perf_counter()
    for i in range(plan.max_reps):
        t0 = time.perf_counter()
        calls[i % len(calls)]()
        samples.append((time.perf_counter() - t0) * 1e3)
        if i + 1 >= plan.min_reps and time.perf_counter() - started > plan.max_seconds:
            break
    return samples


def _time_cuda(calls: list[Callable[[], object]], plan: TimingPlan) -> list[float]:
    torch.cuda.synchronize()
    events = []
    started = time.perf_counter()
    for i in range(plan.max_reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        calls[i % len(calls)]()
        end.record()
        events.append((start, end))
        if i + 1 >= plan.min_reps and time.perf_counter() - started > plan.max_seconds:
            break
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in events]


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples)
