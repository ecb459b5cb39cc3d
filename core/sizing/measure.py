"""`hybridserve step-profile`: measure a step profile with bench's own phases (core/bench/comparison.py) against servers
of the target machine, and fit it (step_fit.py).

Against one plain server (a replica, one unit: a GPU, an MPS share of one, a CPU core):
- warm-up: 2 short requests (not used);
- prefill: at each prompt length of the grid, `repeats` idle requests (one at a time), 2 output tokens: TTFT;
- decode: at each batch size b and prompt length c, b requests sent at once, `decode_output` tokens each: the
  median over the requests of each one's mean inter-token time (vLLM's TPOT: one decode step of b requests).
Against a P/D deployment of the same units (optional): at each of the prompt lengths, `repeats` idle requests of
2 output tokens, token 1 from prefill: the first inter-token gap is the proxy's hop, decode's READ and one decode
step. Without one, the profile's transfer is left at zero and says so.
The server's KV cache blocks come from its `/metrics` (vllm:cache_config_info, num_gpu_blocks); its scheduler
limits are what it was launched with (given here: /metrics does not report them).
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass, replace
from pathlib import Path
from statistics import median

from hybridserve.core.bench.comparison import BenchRequest, BenchTarget, bench
from hybridserve.core.bench.lengths import LengthDist
from hybridserve.core.bench.load import Load
from hybridserve.core.bench.phase import PhaseSpec
from hybridserve.core.common.errors import CouldNotRunError, InputError
from hybridserve.core.deployments.target import parse_target
from hybridserve.core.launch.instance_cache import instance_cache
from hybridserve.core.launch.topology import Device, EngineInstance, EngineOptions
from hybridserve.core.layout.capacity import Capacity
from hybridserve.core.layout.descriptors import Scheme, transfer_cost
from hybridserve.core.model.profiles import load_model
from hybridserve.core.sizing.step_fit import fit_steps, fit_transfer, itl_observation, ttft_observation
from hybridserve.core.sizing.step_profile import EngineLimits, StepProfile, TransferCost

MAX_CALIBRATION_REQUESTS = 160
_BLOCKS = re.compile(r'^vllm:cache_config_info\{[^}]*num_gpu_blocks="(\d+)"', re.M)


@dataclass(frozen=True, kw_only=True)
class MeasureRequest:
    replica_url: str
    model: Path
    unit: str  # what the server has, in words ("one CPU core", "H200, 50 % of the SMs (MPS)")
    device: str
    limits: EngineLimits
    pd_url: str | None = None
    prefill_lens: tuple[int, ...] = (64, 256, 512, 1024, 1536)
    batches: tuple[int, ...] = (1, 2, 4, 8)
    decode_lens: tuple[int, ...] = (128, 1024)
    decode_output: int = 32
    transfer_lens: tuple[int, ...] = (256, 1024, 1536)
    repeats: int = 3
    tp: int = 1
    name: str = "measured"
    num_blocks: int | None = None  # None: from the server's /metrics
    timeout_s: float = 600.0
    steps_from: StepProfile | None = None  # measure the transfer only, on top of this profile's steps
    calibrate: tuple[str, ...] = ()  # proxies (of replicas or of P/D) whose load factor to measure (calibrate.py)
    calibration_requests: int = 3  # per seat: requests = this x the seats (engines x max_num_seqs)


def _phase(lens: int, out: int, num: int, concurrency: int) -> PhaseSpec:
    return PhaseSpec(load=Load(max_concurrency=concurrency), num_requests=num,
                     input_len=LengthDist(min_tokens=lens, max_tokens=lens),
                     output_len=LengthDist(min_tokens=out, max_tokens=out))


def _bench(url: str, phases: list[PhaseSpec], request: MeasureRequest) -> list:
    report = bench(BenchRequest(targets=(BenchTarget(role="deployment", target=parse_target(url, what="url")),),
                                phases=tuple(phases), model=request.model, request_timeout_s=request.timeout_s,
                                device=request.device))
    results = report.targets[0].phases
    failed = [p for p in results if p.client.num_failed]
    if failed:
        raise CouldNotRunError(f"step-profile: {failed[0].client.num_failed} request(s) failed at {url} "
                               f"({failed[0].client.first_error})")
    return results


def _tpot(record) -> float:  # noqa: ANN001 (RequestRecord)
    """A request's mean inter-token time, (end - first token) / (tokens - 1): a decode step of its batch. Robust
    where the API server sends tokens in bursts (a starved CPU: gaps of 0.04 ms beside 6 ms were seen), which makes
    the pooled gaps' median meaningless."""
    return (record.e2e_s - record.ttft_s) / max(1, record.output_tokens - 1)


def server_blocks(url: str) -> int:
    import httpx

    try:
        text = httpx.get(f"{url}/metrics", timeout=30).text
    except httpx.HTTPError as exc:
        raise CouldNotRunError(f"step-profile: {url}/metrics: {type(exc).__name__}: {exc}") from None
    found = _BLOCKS.search(text)
    if found is None:
        raise CouldNotRunError(f"step-profile: {url}/metrics has no vllm:cache_config_info with num_gpu_blocks; "
                               "accepted: a vLLM server's URL (not a proxy's), or --num-blocks")
    return int(found.group(1))


def measure(request: MeasureRequest) -> StepProfile:
    if request.steps_from is not None:
        if not (request.pd_url or request.calibrate):
            raise InputError("--steps-from: accepted with --pd or --calibrate (what to measure on top of the steps)")
        profile = request.steps_from
        if request.pd_url:
            transfer, rows = _measure_transfer(request, profile.coefficients)
            profile = replace(profile, transfer=transfer, measured={**profile.measured, "transfer": rows})
        return _calibrated(request, profile)
    longest = max(request.prefill_lens + request.decode_lens) + request.decode_output
    if longest > request.limits.max_model_len:
        raise InputError(f"step-profile: prompts of up to {longest} tokens do not fit --max-model-len "
                         f"{request.limits.max_model_len}; accepted: shorter --prefill-lens / --decode-lens")
    if max(request.batches) > request.limits.max_num_seqs:
        raise InputError(f"--batches {max(request.batches)}: more than --max-num-seqs {request.limits.max_num_seqs}")
    budget = request.limits.max_num_batched_tokens
    num_blocks = request.num_blocks or server_blocks(request.replica_url)
    decode_grid, too_big = _decode_grid(request, num_blocks)
    phases = [_phase(32, 2, 2, 1)] + [_phase(n, 2, request.repeats, 1) for n in request.prefill_lens]
    phases += [_phase(c, request.decode_output, b, b) for b, c in decode_grid]
    results = _bench(request.replica_url, phases, request)[1:]
    observations = []
    for n, result in zip(request.prefill_lens, results):
        observations.append(ttft_observation(n, budget, median(r.ttft_s for r in result.records)))
    for (b, c), result in zip(decode_grid, results[len(request.prefill_lens):]):
        observations.append(itl_observation(b, c, request.decode_output, median(_tpot(r) for r in result.records)))
    coefficients, residuals = fit_steps(observations)
    transfer, transfer_rows = TransferCost(), []
    if request.pd_url:
        transfer, transfer_rows = _measure_transfer(request, coefficients)
    return _calibrated(request, StepProfile(
        name=request.name, unit=request.unit, device=request.device, model=request.model.name, tp=request.tp,
        coefficients=coefficients, transfer=transfer, limits=request.limits,
        num_blocks=num_blocks,
        measured={"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                  "prompt_tokens": [min(request.prefill_lens), max(request.prefill_lens)],
                  "max_batch": max(b for b, _ in decode_grid), "fit": residuals,
                  "decode_batches_not_fitting": [f"b{b} c{c}" for b, c in too_big],
                  "transfer": transfer_rows or "not measured (no P/D deployment given): zero"}))


def _calibrated(request: MeasureRequest, profile: StepProfile) -> StepProfile:
    """The profile with each --calibrate proxy's load factor (calibrate.py)."""
    import httpx

    from hybridserve.core.sizing.calibrate import load_factor
    from hybridserve.core.sizing.candidates import Candidate, EngineBuilder

    factors, rows = dict(profile.load_factors), []
    builder = EngineBuilder(load_model(str(request.model)), profile)
    for url in request.calibrate:
        health = httpx.get(f"{url}/health", timeout=30).json()
        replicas, prefill, decode = (len(health.get(k) or ()) for k in ("replica", "prefill", "decode"))
        if not (replicas or (prefill and decode)):
            raise CouldNotRunError(f"--calibrate {url}: its /health lists no replica and no prefill/decode; "
                                   "accepted: the URL of the project's proxy")
        candidate = Candidate(name="", num_replicas=replicas, replica_tp=request.tp, num_prefill=prefill,
                              prefill_tp=request.tp, num_decode=decode, decode_tp=request.tp)
        longest = min(max(request.prefill_lens), request.limits.max_model_len - 128)
        per_engine = min(request.limits.max_num_seqs, profile.num_blocks // max(1, _blocks(request, longest // 2 + 68)))
        seats = (replicas or decode) * max(1, per_engine)  # every seat busy, as many as the blocks hold
        phase = PhaseSpec(load=Load(max_concurrency=seats),
                          num_requests=min(MAX_CALIBRATION_REQUESTS, request.calibration_requests * seats),
                          input_len=LengthDist(min_tokens=64, max_tokens=longest),
                          output_len=LengthDist(min_tokens=8, max_tokens=128))
        result = _bench(url, [_phase(32, 2, 2, 1), phase], request)[1]
        pairs = [(r.input_tokens, r.max_output_tokens) for r in result.records]
        kind = "replicas" if replicas else "pd"
        factors[kind] = load_factor(builder, candidate, pairs, seats, result.client.wall_s)
        rows.append({"kind": kind, "url": url, "concurrency": seats, "requests": len(pairs),
                     "measured_wall_s": round(result.client.wall_s, 3), "load_factor": factors[kind]})
    if not rows:
        return profile
    return replace(profile, load_factors=factors, measured={**profile.measured, "calibration": rows})


def _blocks(request: MeasureRequest, tokens: int) -> int:
    return Capacity(weights_bytes=0, kv_cache_bytes=0, num_blocks=0).blocks_per_request(_layout(request), tokens)


def _layout(request: MeasureRequest):  # noqa: ANN202 (RankLayout)
    instance = EngineInstance(port=1, side_channel_port=2, tp=request.tp)
    return instance_cache(load_model(str(request.model)), Device.parse(request.device), EngineOptions(),
                          instance).layout


def _decode_grid(request: MeasureRequest, num_blocks: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(batch, prompt) pairs whose b requests fit the engine's blocks at their last token (the layout's blocks per
    request, a GDN state block per group included), and the ones that would not: vLLM would queue or preempt them,
    and their ITL would not be one decode step of b."""

    layout, fits, too_big = _layout(request), [], []
    empty = Capacity(weights_bytes=0, kv_cache_bytes=0, num_blocks=0)
    for b in request.batches:
        for c in request.decode_lens:
            need = b * empty.blocks_per_request(layout, c + request.decode_output)
            (fits if need <= num_blocks else too_big).append((b, c))
    if not fits:
        raise InputError(f"--batches/--decode-lens: no decode batch fits the engine's {num_blocks} blocks; "
                         "accepted: smaller batches or prompts")
    return fits, too_big


def _measure_transfer(request: MeasureRequest, coefficients) -> tuple[TransferCost, list[dict]]:  # noqa: ANN001
    """READ seconds per length = P/D's first gap - the proxy's hop - one decode step at that context."""

    phases = [_phase(32, 2, 2, 1)] + [_phase(n, 2, request.repeats, 1) for n in request.transfer_lens]
    results = _bench(request.pd_url, phases, request)[1:]
    layout = _layout(request)
    rows, report = [], []
    for n, result in zip(request.transfer_lens, results):
        gap = median(r.itl_s[0] for r in result.records if r.itl_s)
        step = coefficients.step_s(num_tokens=1, num_seqs=1, attention_pairs=n + 2)
        read_s = max(0.0, gap - coefficients.http_s - step)
        cost = transfer_cost(layout, layout, n + 1, Scheme.VLLM)
        rows.append((cost.served_descriptors, cost.total_bytes, read_s))
        report.append({"prompt_tokens": n, "first_gap_s": round(gap, 6), "read_s": round(read_s, 6),
                       "descriptors": cost.served_descriptors, "bytes": cost.total_bytes})
    return fit_transfer(rows), report
