"""Time one backend setting: warm-up, then one timed call per repetition, cycling through several input sets so
that caches do not flatter small shapes.

On GPU the clock is CUDA events around the call, with the GPU kept busy (`torch.cuda._sleep`) while the host
enqueues it: the events then see the call's GPU time, as in a model's forward pass where the host runs ahead of
the GPU. The host time to enqueue a call is measured too (it is what a call costs when the host does not run
ahead). A call that syncs with the host inside loses that lead, and its wait shows in its GPU time. Host-inclusive
latency is the wall time of one call from an idle GPU to its end (synchronize, call, synchronize): what a call
costs when nothing overlaps it, host enqueue and GPU work in series. On CPU the clock is perf_counter and the
three numbers are one.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

ASSUMED_GPU_HZ = 2.0e9  # converts the wanted host lead into _sleep cycles (H200 boost ~1.98 GHz)


@dataclass(frozen=True, kw_only=True)
class TimingPlan:
    num_warmup: int = 3
    max_reps: int = 20
    min_reps: int = 3
    max_seconds: float = 1.0  # per setting, after warm-up: slow settings get fewer repetitions


@dataclass(frozen=True, kw_only=True)
class Samples:
    device_ms: list[float]  # GPU time (events) on CUDA, wall time on CPU
    host_ms: list[float]  # time for the call to return on the host
    latency_ms: list[float]  # host-inclusive: idle GPU -> call -> synchronized (CPU: the wall time)


def _host_ms(call: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    call()
    return (time.perf_counter() - t0) * 1e3


def time_calls(calls: list[Callable[[], object]], device: torch.device, plan: TimingPlan) -> Samples:
    """`calls[i]` runs the kernel on input set i."""
    warm = [_host_ms(calls[i % len(calls)]) for i in range(plan.num_warmup)]
    if device.type == "cuda":
        torch.cuda.synchronize()
        return _time_cuda(calls, plan, lead_ms=min(50.0, max(2.0, 3 * min(warm, default=1.0))))
    host: list[float] = []
    started = time.perf_counter()
    for i in range(plan.max_reps):
        host.append(_host_ms(calls[i % len(calls)]))
        if i + 1 >= plan.min_reps and time.perf_counter() - started > plan.max_seconds:
            break
    return Samples(device_ms=host, host_ms=host, latency_ms=host)


def _time_cuda(calls: list[Callable[[], object]], plan: TimingPlan, lead_ms: float) -> Samples:
    events, host = [], []
    started = time.perf_counter()
    for i in range(plan.max_reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(int(lead_ms * 1e-3 * ASSUMED_GPU_HZ))  # the GPU waits here while the host enqueues
        start.record()
        host.append(_host_ms(calls[i % len(calls)]))
        end.record()
        events.append((start, end))
        torch.cuda.synchronize()  # one call at a time: the next sleep starts from an idle queue
        if i + 1 >= plan.min_reps and time.perf_counter() - started > plan.max_seconds:
            break
    return Samples(device_ms=[s.elapsed_time(e) for s, e in events], host_ms=host,
                   latency_ms=[_latency_ms(calls[i % len(calls)]) for i in range(len(events))])


def _latency_ms(call: Callable[[], object]) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    call()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


def first_call_ms(call: Callable[[], object], device: torch.device) -> float:
    """Wall time of one call, synchronized on CUDA: for a setting's first call, its compile (JIT) time included."""
    if device.type != "cuda":
        return _host_ms(call)
    return _latency_ms(call)


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples)
