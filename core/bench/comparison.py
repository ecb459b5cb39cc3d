"""`bench`: the same phases against a P/D deployment, a baseline and an optional A/A control, one target at a time.

Targets are core/deployments' (target.py): a URL that already serves, or a configuration started here
and stopped after its phases, so two started targets never share the machine. Every target gets the same drawn
lengths, arrival times and prompts. Around each phase the decode servers' /metrics are scraped (for a P/D target:
the ones its proxy lists, unless given), and their difference is that phase's NIXL stats; so are the servers that
compute the prompts (a P/D target's prefill servers, else the target itself), for the engines' own timings.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hybridserve.core.bench.client_stats import ClientSummary, summarize
from hybridserve.core.bench.driver import run_phase
from hybridserve.core.bench.engine_timing import EngineTiming, PREFILL_TIME, engine_timing
from hybridserve.core.bench.goodput import Slo
from hybridserve.core.bench.likeness.alike import Likeness, TargetSettings
from hybridserve.core.bench.likeness.before_measuring import SettingsBook, read_before_measuring
from hybridserve.core.bench.phase import PhaseSpec, PhaseWork, check_phase, draw_work
from hybridserve.core.bench.prediction import Prediction
from hybridserve.core.bench.prompts import make_prompts
from hybridserve.core.bench.scrape import (
    decode_urls_behind, first_token_behind, own_metrics, prefill_urls_behind, proxy_health, scrape, settled_scrape,
)
from hybridserve.core.bench.served_model import ServedModel, served_model
from hybridserve.core.bench.server_metrics import NixlStats, XFER_TIME, delta, nixl_stats
from hybridserve.core.bench.stream import RequestRecord
from hybridserve.core.bench.vocab import Vocabulary, find_vocabulary
from hybridserve.core.common.errors import InputError
from hybridserve.core.common.progress import ProgressCallback, counted
from hybridserve.core.deployments.client import auth_headers
from hybridserve.core.deployments.deployed import deployed
from hybridserve.core.deployments.target import Target, default_model
from hybridserve.core.launch.topology import Device



@dataclass(frozen=True, kw_only=True)
class BenchTarget:
    role: str  # "deployment", "baseline" or "control"
    target: Target
    metrics_urls: tuple[str, ...] = ()  # decode servers' base URLs; (): the ones the proxy lists, else the target


@dataclass(frozen=True, kw_only=True)
class BenchRequest:
    targets: tuple[BenchTarget, ...]
    phases: tuple[PhaseSpec, ...]
    seed: int = 0  # lengths and arrival times
    prompt_seed: int | None = None  # prompt ids; None: a fresh one (no prefix-cache hit from an earlier run)
    model: Path | None = None  # for started configurations and the prediction; None: validate's default
    served_model: str | None = None  # name to ask URL endpoints for; None: the first listed
    vocab_size: int | None = None  # None: from the model's config
    base_port: int = 8000
    run_root: Path = Path("runs")
    num_cores: int = 2
    start_timeout_s: float = 300.0
    request_timeout_s: float = 300.0
    device: str = "cpu"
    engine: Any = None  # launch's EngineOptions for started configurations and the prediction
    api_key: str | None = field(default=None, repr=False)  # the deployment's front key, sent to it only
    allow_unlike: bool = False  # measure targets whose engine settings differ (marked), instead of refusing
    gpus: dict[str, int] = field(default_factory=dict)  # URL targets' GPU counts by role (--gpus)
    slo: Slo | None = None  # goodput's objectives; None: no goodput


@dataclass(frozen=True, kw_only=True)
class PhaseResult:
    spec: PhaseSpec
    client: ClientSummary  # the phase's requests
    probes: ClientSummary | None
    nixl: NixlStats | None  # None: no NIXL metrics on the scraped servers
    records: tuple[RequestRecord, ...]
    engine: EngineTiming | None = None  # the prompt-computing servers' own timings; None: none scraped


@dataclass(frozen=True, kw_only=True)
class TargetResult:
    role: str
    label: str
    url: str
    metrics_urls: tuple[str, ...]
    run_dir: Path | None
    phases: tuple[PhaseResult, ...]
    elapsed_s: float
    num_gpus: int | None = None  # for tokens/s per GPU; None: not known (a URL without --gpus, or CPU)


@dataclass(frozen=True, kw_only=True)
class BenchReport:
    model: str
    vocabulary: Vocabulary
    seed: int
    prompt_seed: int
    phases: tuple[PhaseWork, ...]
    predictions: tuple[Prediction | None, ...]  # per phase, over its requests and probes (each makes a transfer),
    #                                             idle phases from the deployment's history in this run
    probe_predictions: tuple[Prediction | None, ...]
    targets: tuple[TargetResult, ...]
    elapsed_s: float
    settings: tuple[TargetSettings, ...] = ()  # every target's engine settings, as last read
    likeness: Likeness | None = None  # their comparison (what the table says before any number)
    slo: Slo | None = None

    def target(self, role: str) -> TargetResult | None:
        return next((t for t in self.targets if t.role == role), None)


class _Prompts:
    """The run's prompts, drawn once the vocabulary is known (from the first target's model)."""

    def __init__(self, works: tuple[PhaseWork, ...], seed: int) -> None:
        self.works, self.seed, self.drawn = works, seed, None

    def get(self, vocabulary: Vocabulary) -> list[tuple[tuple, tuple]]:
        if self.drawn is None:
            rng = random.Random(self.seed)
            draw = lambda lens: make_prompts(lens, vocab_size=vocabulary.size, excluded=vocabulary.excluded, rng=rng)  # noqa: E731
            self.drawn = [(draw(w.input_lens), draw((w.spec.probe.input_tokens,) * w.spec.probe.num_probes)
                           if w.spec.probe else ()) for w in self.works]
        return self.drawn


def bench(request: BenchRequest, progress: ProgressCallback | None = None) -> BenchReport:
    """Every phase on every target in turn; the report holds each request's record."""

    start = time.monotonic()
    for spec in request.phases:  # refused before anything starts; the context length is checked per target
        check_phase(spec, None)
    rng = random.Random(request.seed)
    works = tuple(draw_work(spec, rng) for spec in request.phases)
    prompt_seed = request.prompt_seed if request.prompt_seed is not None else random.SystemRandom().randrange(2**62)
    prompts = _Prompts(works, prompt_seed)
    model = (request.model or default_model()).resolve() if request.model or _starts_any(request) else None
    book = read_before_measuring(request, model)  # refuses unlike targets here, before any server starts
    results, found = [], {}  # found: the vocabulary and what the last target served
    for target in request.targets:
        results.append(_run_target(target, request, model, works, prompts, found, progress, book))
    served = found.get("served")
    predictor = _predictor(model or (served.local_folder if served else None), request,
                           is_first_token_from_prefill=found.get("first_token") == "prefill")
    return BenchReport(
        model=str(model or (served.root if served else "?")), vocabulary=found["vocabulary"], seed=request.seed,
        prompt_seed=prompt_seed, phases=works,
        predictions=tuple(predictor.predict_phases(works, is_started=_started_deployment(request)) if predictor
                          else (None,) * len(works)),
        probe_predictions=tuple(predictor.predict_range((w.spec.probe.input_tokens,), "probes run beside the load")
                                if predictor and w.spec.probe else None for w in works),
        targets=tuple(results), elapsed_s=time.monotonic() - start, settings=book.targets,
        likeness=book.check(), slo=request.slo)


def _run_target(target: BenchTarget, request: BenchRequest, model: Path | None, works: tuple[PhaseWork, ...],
                prompts: _Prompts, found: dict, progress: ProgressCallback | None, book: SettingsBook) -> TargetResult:
    """Start the target (or reach its URL), read what a started one runs with (refused there if it differs), check
    the phases fit its context, run them; stop what was started."""
    import httpx


    begun = time.monotonic()
    with deployed(target.target, model=model or default_model(), base_port=request.base_port,
                  run_root=request.run_root.resolve(), num_cores=request.num_cores,
                  timeout_s=request.start_timeout_s, device=request.device, engine=request.engine) as deployment, \
            httpx.Client(timeout=30) as client:  # the front key only on requests to the deployment's front
        name = request.served_model or (model.name if target.target.config is not None and model else None)
        headers = auth_headers(request.api_key if target.role == "deployment" else None)  # its front key only
        served = found["served"] = served_model(client, deployment.url, name, headers)
        if deployment.run_dir is not None:  # started here: its log and /metrics say what vLLM resolved
            book.read_started(client, target.role, deployment.run_dir, served.max_model_len)
            book.check()
        if "vocabulary" not in found:  # prompts are drawn once, from the first target's model
            found["vocabulary"] = find_vocabulary(request.vocab_size, model, served)
        for work in works:
            check_phase(work.spec, served.max_model_len)
        health = proxy_health(client, deployment.url)
        urls = target.metrics_urls or decode_urls_behind(health) or own_metrics(client, deployment.url)
        prefill_urls = prefill_urls_behind(health) or own_metrics(client, deployment.url)
        if target.role == "deployment":
            found["first_token"] = first_token_behind(health)
        phases = tuple(_run_phase(client, deployment.url, served, (urls, prefill_urls), work, drawn, request,
                                  target.role, i, progress, headers)
                       for i, (work, drawn) in enumerate(zip(works, prompts.get(found["vocabulary"]))))
    return TargetResult(role=target.role, label=target.target.label, url=deployment.url, metrics_urls=urls,
                        run_dir=deployment.run_dir, phases=phases, elapsed_s=time.monotonic() - begun,
                        num_gpus=book.by_role[target.role].num_gpus)


def _started_deployment(request: BenchRequest) -> bool:
    """Whether bench started the deployment it predicts for (fresh, then only this run's phases in order); a URL's
    history before the run is unknown."""
    return any(t.role == "deployment" and t.target.config is not None for t in request.targets)


def _starts_any(request: BenchRequest) -> bool:
    return any(t.target.config is not None for t in request.targets)


def _run_phase(client: Any, url: str, served: ServedModel, scraped: tuple[tuple[str, ...], tuple[str, ...]],
               work: PhaseWork, drawn: tuple, request: BenchRequest, role: str, index: int,
               progress: ProgressCallback | None, headers: dict[str, str] | None = None) -> PhaseResult:
    """`scraped`: (the decode servers, for NIXL stats; the prompt-computing servers, for the engines' timings)."""
    metrics_urls, prefill_urls = scraped
    prompts, probe_prompts = drawn
    on_done = counted(progress, f"{role}: phase {index + 1} ({work.spec.name})", len(prompts) + len(probe_prompts))
    same = prefill_urls == metrics_urls  # a plain server: one scrape serves both
    before = scrape(client, metrics_urls)
    engines_before = before if same else scrape(client, prefill_urls)
    records = run_phase(url, served.name, work, prompts, probe_prompts, timeout_s=request.request_timeout_s,
                        on_done=on_done, headers=headers)
    xfer, prefill = (f"{XFER_TIME}_count", None), (f"{PREFILL_TIME}_count", None)
    after = settled_scrape(client, metrics_urls, (xfer, prefill) if same else (xfer,))
    engines_after = after if same else settled_scrape(client, prefill_urls, (prefill,))
    load = [r for r in records if not r.is_probe]
    probes = [r for r in records if r.is_probe]
    return PhaseResult(spec=work.spec, client=summarize(load, request.slo),
                       probes=summarize(probes, request.slo) if probes else None,
                       nixl=nixl_stats(delta(after, before)), records=records,
                       engine=engine_timing(delta(engines_after, engines_before)))


def _predictor(model: Path | None, request: BenchRequest, *, is_first_token_from_prefill: bool):  # noqa: ANN202
    """None where the model's folder is not on this machine (a URL target serving a hub id)."""
    from hybridserve.core.bench.prediction import Predictor

    if model is None:
        return None
    try:
        return Predictor(model, device=Device.parse(request.device), engine=request.engine,
                         is_first_token_from_prefill=is_first_token_from_prefill)
    except InputError:
        return None
