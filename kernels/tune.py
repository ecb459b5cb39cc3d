"""tune: for each TP and batch shape, every backend x knob setting, verified first, then timed twice.

Pass 1 picks the winner; pass 2 (fresh repetitions, reverse order) gives the numbers that are reported, so the
winner's own timing noise cannot flatter it: `winner_ms / best_ms` is what dispatch loses to the best setting.
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
from hybridserve.kernels.timing import TimingPlan, median_ms, time_calls
from hybridserve.kernels.tuned_profile import Choice, TunedEntry, TunedProfile
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


def _candidates(req: TuneRequest, shape: GdnShape, rejected: dict[str, str]) -> list[Choice]:
    """Every supported setting that passes the judge on the capped shape; the others land in `rejected`."""
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
            if result.status is Status.PASS:
                found.append(Choice(backend=b.name, knobs=knobs))
            else:
                why = result.reason or f"o err {result.o_error:.2e}, state err {result.state_error:.2e}"
                rejected[Choice(backend=b.name, knobs=knobs).label] = f"{result.status.value}: {why}"
    return found


def _time_all(req: TuneRequest, shape: GdnShape, choices: list[Choice], progress: Progress | None,
              ) -> tuple[dict[Choice, float], dict[Choice, float], dict[Choice, float]]:
    sets = [make_inputs(shape, dtype=TORCH_DTYPES[req.dtype], device=req.device, seed=s)
            for s in range(req.num_input_sets)]
    by_name = {b.name: b for b in req.backends}

    def calls(c: Choice) -> list[Callable[[], object]]:
        fn, knobs = by_name[c.backend].prefill, dict(c.knobs)
        return [lambda x=x: fn(**x.as_kwargs(), output_final_state=True, max_seqlen=max(shape.seqlens), **knobs)
                for x in sets]

    passes: list[dict[Choice, float]] = [{}, {}]
    host: dict[Choice, float] = {}
    for i, order in enumerate((choices, list(reversed(choices)))):
        for c in order:
            samples = time_calls(calls(c), req.device, req.timing)
            passes[i][c], host[c] = median_ms(samples.device_ms), median_ms(samples.host_ms)
            if progress:
                progress(f"pass {i + 1} {c.label} {passes[i][c]:.4f} ms (host {host[c]:.4f} ms)")
    del sets
    return passes[0], passes[1], host


def tune_shape(req: TuneRequest, tp: int, batch: BatchShape, progress: Progress | None = None) -> TunedEntry | None:
    hk, hv = model_heads(req.model, tp)
    gdn = req.model.gdn
    shape = GdnShape(seqlens=(batch.seq_len,) * batch.num_seqs, num_key_heads=hk, num_value_heads=hv,
                     key_head_dim=gdn.key_head_dim, value_head_dim=gdn.value_head_dim)
    rejected: dict[str, str] = {}
    choices = _candidates(req, shape, rejected)
    if not choices:
        return None
    first, confirm, host = _time_all(req, shape, choices, progress)
    ranked = tuple(sorted(choices, key=lambda c: first[c]))
    winner = ranked[0]

    def time_of(backend: str, knobs: tuple) -> float | None:
        return confirm.get(Choice(backend=backend, knobs=knobs))

    if req.device.type == "cuda":
        torch.cuda.empty_cache()
    return TunedEntry(
        tp=tp, num_key_heads=hk, num_value_heads=hv, key_head_dim=gdn.key_head_dim, value_head_dim=gdn.value_head_dim,
        num_seqs=batch.num_seqs, seq_len=batch.seq_len, winner=winner, winner_ms=round(confirm[winner], 5),
        best_ms=round(min(confirm.values()), 5), fla_ms=time_of("fla", ()),
        flashinfer_auto_ms=time_of("flashinfer", (("use_cp", "auto"),)),
        times_ms={c.label: round(confirm[c], 5) for c in ranked},
        first_pass_ms={c.label: round(first[c], 5) for c in ranked},
        host_ms={c.label: round(host[c], 5) for c in ranked}, rejected=rejected, ranked=ranked,
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
        entries=tuple(entries),
    )
