"""`validate`: the same prompts to a baseline and a candidate, greedy with logprobs, then a verdict."""

from __future__ import annotations

import time
from typing import Any
from dataclasses import dataclass, field, replace
from pathlib import Path

from hybridserve.core.common.errors import CouldNotRunError, InputError
from hybridserve.core.common.progress import ProgressCallback, counted
from hybridserve.core.deployments.client import Completion, RequestSettings, complete_all
from hybridserve.core.deployments.deployed import check_scheduling, deployed
from hybridserve.core.deployments.target import Target, default_model
from hybridserve.core.validate.dataset import Dataset
from hybridserve.core.validate.metrics import PromptComparison, compare, summarize
from hybridserve.core.validate.noise import Noise, measure
from hybridserve.core.validate.thresholds import DRIFT_FLOOR, Thresholds
from hybridserve.core.validate.verdict import Verdict, judge, prompt_regressions

# (phase, done, total): phase is "baseline" or "candidate"; done counts answered prompts.


@dataclass(frozen=True, kw_only=True)
class ValidateRequest:
    baseline: Target
    candidate: Target
    dataset: Dataset
    thresholds: Thresholds = field(default_factory=Thresholds)
    settings: RequestSettings = field(default_factory=RequestSettings)
    model: Path | None = None  # for configurations validate starts; None: the trained recall model
    base_port: int = 8000
    run_root: Path = Path("runs")
    num_cores: int = 2
    start_timeout_s: float = 300.0
    device: str = "cpu"  # where configurations validate starts run: cpu or cuda (launch's --device)
    engine: Any = None  # launch's EngineOptions for started configurations (None: launch's defaults)
    # The baseline's answers to these prompts from an earlier report (`baseline_answers`): not asked again, so
    # several candidates are judged against one baseline run. Greedy decoding makes them the answers it would give.
    baseline_answers: tuple[Completion, ...] | None = None
    # A second clean run (the baseline's URL again, or an identical server): its difference from the baseline sets
    # the near-tie tolerance (noise.py). Its prompts go in reverse order, so they meet other batches.
    reference: Target | None = None
    noise: Noise | None = None  # a measurement made earlier (the same model and servers): used instead of reference


@dataclass(frozen=True, kw_only=True)
class TargetRun:
    label: str
    url: str
    run_dir: Path | None
    schedulers: dict[str, str]  # engine log -> scheduler class seen in it (started configurations only)
    elapsed_s: float


@dataclass(frozen=True, kw_only=True)
class ValidationReport:
    dataset: str
    verdict: Verdict
    comparisons: tuple[PromptComparison, ...]
    baseline: TargetRun
    candidate: TargetRun
    elapsed_s: float
    baseline_answers: tuple[Completion, ...] = ()  # in prompt order; for a later request's `baseline_answers`
    noise: Noise | None = None  # where the near-tie tolerance came from (None: a given limit)
    reference: TargetRun | None = None
    candidate_answers: tuple[Completion, ...] = ()  # in prompt order: the evidence, to judge again later
    reference_answers: tuple[Completion, ...] = ()  # in prompt order (the reference ran them reversed)

    @property
    def regressions(self) -> tuple[str | None, ...]:
        """Per prompt: why it is a regression on its own (None: it is not)."""
        return prompt_regressions(self.comparisons, self.verdict.thresholds)


def _run_target(phase: str, target: Target, request: ValidateRequest, model: Path,
                progress: ProgressCallback | None, *, is_reversed: bool = False) -> tuple[list[Completion], TargetRun]:
    start = time.monotonic()
    prompts = [e.prompt for e in request.dataset.examples]
    prompts = prompts[::-1] if is_reversed else prompts
    on_done = counted(progress, phase, len(prompts))
    with deployed(target, model=model, base_port=request.base_port, run_root=request.run_root.resolve(),
                  num_cores=request.num_cores, timeout_s=request.start_timeout_s, device=request.device,
                  engine=request.engine) as deployment:
        settings = request.settings if phase == "candidate" else replace(request.settings, api_key=None)
        if target.config is not None and settings.model is None:  # launch serves the folder's name
            settings = replace(settings, model=model.name)
        completions = complete_all(deployment.url, prompts, settings, on_done)
        completions = completions[::-1] if is_reversed else completions
        failed = [c.error for c in completions if c.error is not None]
        if failed and phase == "baseline":
            raise CouldNotRunError(f"baseline {target.label}: {len(failed)} of {len(prompts)} prompts failed; first: "
                                   f"{failed[0]}")
        schedulers = check_scheduling(target.config, deployment.engine_logs) if target.config else {}
    run = TargetRun(label=target.label, url=deployment.url, run_dir=deployment.run_dir, schedulers=schedulers,
                    elapsed_s=time.monotonic() - start)
    return completions, run


def measured_limits(thresholds: Thresholds, noise: Noise) -> Thresholds:
    """The near-tie tolerance and the per-prompt drift limit, both from two clean runs: a prompt's mean drift above
    the largest single-position drift the clean runs showed is not noise (never below one bf16 step at the logprobs
    seen, DRIFT_FLOOR). The measurement replaces the configured limit either way, as it does the tolerance: the
    configured 0.05 was measured on CPU with the tiny model. Tighter: with the first token from prefill a corrupted
    state first shows at token 2, so a prompt's mean drift is diluted (zero_after_transfer, 8 tokens, CPU: 0.047 on
    one prompt). Looser: the 60-layer random-weight model on the H200 drifted up to 0.109 at one position between two
    runs of the same server, and a clean P/D prompt's mean drift of 0.0511 failed the fixed 0.05 (benchmarks/HISTORY.md,
    Validate, H200)."""
    drift = max(DRIFT_FLOOR, noise.max_logprob_drift)
    return replace(thresholds, near_tie_tolerance=noise.tolerance, max_logprob_drift=drift)


def validate(request: ValidateRequest, progress: ProgressCallback | None = None) -> ValidationReport:
    """Run the dataset on the baseline, then on the candidate (one deployment at a time), and judge."""

    start = time.monotonic()
    model = (request.model or default_model()).resolve()
    if request.baseline_answers is None:
        base, base_run = _run_target("baseline", request.baseline, request, model, progress)
    else:
        base, base_run = _given_answers(request)
    noise, ref_run, ref = request.noise, None, []
    if noise is None and request.reference is not None:
        ref, ref_run = _run_target("reference", request.reference, request, model, progress, is_reversed=True)
        noise = measure(request.reference.label, base, ref)
    cand, cand_run = _run_target("candidate", request.candidate, request, model, progress)
    thresholds = request.thresholds if noise is None else measured_limits(request.thresholds, noise)
    comparisons = tuple(compare(i, ex, b, c, thresholds.near_tie_tolerance, thresholds.near_tie_tolerance)
                        for i, (ex, b, c) in enumerate(zip(request.dataset.examples, base, cand)))
    verdict = judge(summarize(comparisons), thresholds, comparisons)
    return ValidationReport(dataset=request.dataset.name, verdict=verdict, comparisons=comparisons,
                            baseline=base_run, candidate=cand_run, elapsed_s=time.monotonic() - start,
                            baseline_answers=tuple(base), noise=noise, reference=ref_run,
                            candidate_answers=tuple(cand), reference_answers=tuple(ref))


def _given_answers(request: ValidateRequest) -> tuple[list[Completion], TargetRun]:
    answers = request.baseline_answers or ()
    if len(answers) != len(request.dataset.examples):
        raise InputError(f"baseline answers: {len(answers)} given for {len(request.dataset.examples)} prompts")
    target = request.baseline
    return list(answers), TargetRun(label=target.label, url=target.url or target.label, run_dir=None, schedulers={},
                                    elapsed_s=0.0)
