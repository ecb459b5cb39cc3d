"""tune: for each TP and batch shape, every backend x knob setting, verified first, then timed twice.

Pass 1 picks the winner; pass 2 (fresh repetitions, reverse order) gives the numbers that are reported, so the
winner's own timing noise cannot flatter it: `winner_ms / best_ms` is what dispatch loses to the best setting.
Each pass records GPU time, host (enqueue) time and host-inclusive latency; `rank_by` says which one picks.
The verify call before timing is each setting's first call on the bucket: its wall time is the first-call
(compile) time, a JIT's cost on a new shape class.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass

import torch

from hybridserve.core.model.dtypes import DType
from hybridserve.core.model.spec import ModelSpec
from hybridserve.kernels import naive
from hybridserve.kernels.backend import Backend
from hybridserve.kernels.cases import VerifyCase, model_heads
from hybridserve.kernels.grid import BatchShape
from hybridserve.kernels.inputs import GdnShape, make_inputs
from hybridserve.kernels.summary import closest_vllm_setting, environment
from hybridserve.kernels.timing import Samples, TimingPlan, median_ms, time_calls
from hybridserve.kernels.tuned_profile import Choice, RankBy, TunedEntry, TunedProfile
from hybridserve.kernels.verify import TOLERANCES, TORCH_DTYPES, Status, check_one

Progress = Callable[[str], None]


@dataclass(frozen=True, kw_only=True)
class TuneRequest:
    model: ModelSpec
    tps: tuple[int, ...]
    shapes: tuple[BatchShape, ...]
    backends: tuple[Backend, ...]
    device: torch.device
    dtype: DType = DType.BFLOAT16
    verify_max_len: int = 4096  # the pre-timing check runs on the shape with lengths capped here
    num_input_sets: int = 3
    timing: TimingPlan = TimingPlan()
    rank_by: RankBy = RankBy.GPU


@dataclass(frozen=True, kw_only=True)
class Measured:
    """Medians of one setting in one pass (ms)."""

    gpu_ms: float
    host_ms: float
    latency_ms: float

    @classmethod
    def of(cls, samples: Samples) -> Measured:
        return cls(gpu_ms=median_ms(samples.device_ms), host_ms=median_ms(samples.host_ms),
                   latency_ms=median_ms(samples.latency_ms))

    def key(self, rank_by: RankBy) -> float:
        return self.gpu_ms if rank_by is RankBy.GPU else self.latency_ms


def _candidates(req: TuneRequest, shape: GdnShape, rejected: dict[str, str],
                first_call: dict[Choice, float]) -> list[Choice]:
    """Every supported setting that passes the judge on the capped shape; the others land in `rejected`.
    `first_call` gets each setting's verify-call wall time (its first call on this bucket)."""
    capped = GdnShape(**{**shape.__dict__, "seqlens": tuple(min(n, req.verify_max_len) for n in shape.seqlens)})
    x = make_inputs(capped, dtype=TORCH_DTYPES[req.dtype], device=req.device, seed=7)
    expected = naive.gdn_prefill(**x.as_kwargs())
    case = VerifyCase(case_id="tune", shape=capped, has_initial_state=True)
    found = []
    for b in req.backends:
        ok, reason = b.supports(shape, x.q.dtype, req.device)
        if not ok:
            rejected[b.name] = f"unsupported: {reason}"
            continue
        for knobs in b.knob_space(shape):
            result = check_one(b, knobs, case, x, expected, TOLERANCES[req.dtype])
            choice = Choice(backend=b.name, knobs=knobs)
            if result.call_ms is not None:
                first_call[choice] = result.call_ms
            if result.status is Status.PASS:
                found.append(choice)
            else:
                why = result.reason or f"o err {result.o_error:.2e}, state err {result.state_error:.2e}"
                rejected[choice.label] = f"{result.status.value}: {why}"
    return found


def _time_all(req: TuneRequest, shape: GdnShape, choices: list[Choice], progress: Progress | None,
              ) -> tuple[dict[Choice, Measured], dict[Choice, Measured]]:
    sets = [make_inputs(shape, dtype=TORCH_DTYPES[req.dtype], device=req.device, seed=s)
            for s in range(req.num_input_sets)]
    by_name = {b.name: b for b in req.backends}

    def calls(c: Choice) -> list[Callable[[], object]]:
        fn, knobs = by_name[c.backend].prefill, dict(c.knobs)
        return [lambda x=x: fn(**x.as_kwargs(), output_final_state=True, max_seqlen=max(shape.seqlens), **knobs)
                for x in sets]

    passes: list[dict[Choice, Measured]] = [{}, {}]
    for i, order in enumerate((choices, list(reversed(choices)))):
        for c in order:
            m = passes[i][c] = Measured.of(time_calls(calls(c), req.device, req.timing))
            if progress:
                progress(f"pass {i + 1} {c.label} {m.gpu_ms:.4f} ms (host {m.host_ms:.4f}, latency "
                         f"{m.latency_ms:.4f} ms)")
    del sets
    return passes[0], passes[1]


def tune_shape(req: TuneRequest, tp: int, batch: BatchShape, progress: Progress | None = None) -> TunedEntry | None:
    hk, hv = model_heads(req.model, tp)
    gdn = req.model.gdn
    shape = GdnShape(seqlens=(batch.seq_len,) * batch.num_seqs, num_key_heads=hk, num_value_heads=hv,
                     key_head_dim=gdn.key_head_dim, value_head_dim=gdn.value_head_dim)
    rejected: dict[str, str] = {}
    first_call: dict[Choice, float] = {}
    choices = _candidates(req, shape, rejected, first_call)
    if not choices:
        return None
    first, confirm = _time_all(req, shape, choices, progress)
    ranked = tuple(sorted(choices, key=lambda c: first[c].key(req.rank_by)))
    winner = ranked[0]

    def gpu_of(backend: str, knobs: tuple) -> float | None:
        m = confirm.get(Choice(backend=backend, knobs=knobs))
        return m.gpu_ms if m else None

    def table(metric: Callable[[Measured], float], measured: dict[Choice, Measured]) -> dict[str, float]:
        return {c.label: round(metric(measured[c]), 5) for c in ranked}

    if req.device.type == "cuda":
        torch.cuda.empty_cache()
    return TunedEntry(
        tp=tp, num_key_heads=hk, num_value_heads=hv, key_head_dim=gdn.key_head_dim, value_head_dim=gdn.value_head_dim,
        num_seqs=batch.num_seqs, seq_len=batch.seq_len, winner=winner, winner_ms=round(confirm[winner].gpu_ms, 5),
        best_ms=round(min(m.gpu_ms for m in confirm.values()), 5), fla_ms=gpu_of("fla", ()),
        flashinfer_auto_ms=gpu_of("flashinfer", (("use_cp", "auto"),)),
        times_ms=table(lambda m: m.gpu_ms, confirm), first_pass_ms=table(lambda m: m.key(req.rank_by), first),
        host_ms=table(lambda m: m.host_ms, confirm), latency_ms=table(lambda m: m.latency_ms, confirm),
        first_call_ms={c.label: first_call[c] for c in ranked if c in first_call},
        rejected=rejected, ranked=ranked,
    )


def run_tune(req: TuneRequest, progress: Progress | None = None) -> TunedProfile:
    entries = []
    for tp in req.tps:
        for batch in req.shapes:
            def step(label: str, tp: int = tp, batch: BatchShape = batch) -> None:
                if progress:
                    progress(f"TP{tp} {batch.label} {label}")
            entry = tune_shape(req, tp, batch, step)
            if entry is not None:
                entries.append(entry)
    vllm_setting, vllm_times = closest_vllm_setting(entries, req.backends)
    env = environment(req.device)
    return TunedProfile(
        gpu=env["gpu"], device=req.device.type, model=req.model.name, dtype=req.dtype.value,
        created_utc=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), versions=env["versions"],
        vllm_gdn_prefill_backend=vllm_setting, vllm_setting_geomean_ms=vllm_times,
        timing={"num_warmup": req.timing.num_warmup, "max_reps": req.timing.max_reps,
                "num_input_sets": req.num_input_sets, "statistic": "median", "verify_max_len": req.verify_max_len,
                "clock": "cuda events" if req.device.type == "cuda" else "perf_counter"},
        entries=tuple(entries), rank_by=req.rank_by.value,
    )
