"""`hybridserve validate`: does the candidate deployment keep the baseline's accuracy? Exit 0 pass, 1 regression."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from hybridserve.cli.console import out_console, print_json
from hybridserve.cli.options import (
    JsonOpt, StartedBasePortOpt, StartedDeviceOpt, StartedEagerOpt, StartedGdnBackendOpt, StartedRunDirOpt,
    started_timeout_opt,
)
from hybridserve.core.common.errors import CheckFailedError, InputError

Limit = Optional[float]


def command(
    ctx: typer.Context,
    baseline: Annotated[str, typer.Option(help="URL of an OpenAI-compatible server, or a configuration "
                                          "validate starts: single-sync, single-async, pd-async, pd-sync.")] = "single-sync",
    candidate: Annotated[str, typer.Option(help="Same choices as --baseline.")] = "pd-async",
    dataset: Annotated[str, typer.Option(help="'synthetic[:MIN-MAX]' (words; the built-in task), 'random' (token "
                                         "ids, --prompt-len) or a JSONL file of {\"prompt\", \"answer\"}.")] = "synthetic",
    prompt_len: Annotated[Optional[list[int]], typer.Option(help="random: prompt lengths in tokens, e.g. "
                                                            "--prompt-len 1024 8192 32768.")] = None,
    num_prompts: Annotated[Optional[int], typer.Option(help="Prompts to use (synthetic: default 64; random: per "
                                                       "length, default 3).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the synthetic or random prompts.")] = 0,
    reference: Annotated[Optional[str], typer.Option(help="A second clean run (a URL, e.g. the baseline's): its "
                                                     "difference to the baseline sets the near-tie tolerance.")] = None,
    top_logprobs: Annotated[Optional[int], typer.Option(help="Top-k logprobs per token (default 2; random: 5).")] = None,
    max_tokens: Annotated[int, typer.Option(help="Tokens generated per prompt.")] = 8,
    concurrency: Annotated[int, typer.Option(help="Requests in flight per endpoint.")] = 4,
    model: Annotated[Optional[Path], typer.Option(help="Model folder for configurations validate starts "
                                                  "(default: profiles/tiny-qwen3.5-recall when present, "
                                                  "else launch's tiny Qwen3.5).")] = None,
    served_model: Annotated[Optional[str], typer.Option(help="Model name to ask URL endpoints for "
                                                         "(default: the first one they list).")] = None,
    ignore_eos: Annotated[bool, typer.Option(help="Send vLLM's ignore_eos (all tokens generated).")] = False,
    fault: Annotated[Optional[str], typer.Option(help="Arm a fault in the candidate's decode server (tests): "
                                                 "early_completion, zero_after_transfer, stale_state.")] = None,
    thresholds: Annotated[Optional[Path], typer.Option(help="YAML file of limits (the flags below win).")] = None,
    max_accuracy_drop: Annotated[Limit, typer.Option(help="Default 0.03 (vLLM's gsm8k tolerance).")] = None,
    min_candidate_accuracy: Annotated[Limit, typer.Option(help="Absolute floor; default none.")] = None,
    min_token_agreement: Annotated[Limit, typer.Option(help="Default 0.95.")] = None,
    max_logprob_drift: Annotated[Limit, typer.Option(help="Mean |dlogprob| before divergence; default 0.05.")] = None,
    max_failed_requests: Annotated[Limit, typer.Option(help="Prompts the candidate may refuse; default 0.")] = None,
    near_tie_tolerance: Annotated[Limit, typer.Option(help="Top-2 logprob gap that forgives a divergence; "
                                                      "default 0.02.")] = None,
    base_port: StartedBasePortOpt = 8000,
    run_dir: StartedRunDirOpt = Path("runs"),
    timeout: started_timeout_opt(300) = None,  # type: ignore[valid-type]
    junit: Annotated[Optional[Path], typer.Option(help="Write a JUnit XML report here.")] = None,
    save_completions: Annotated[Optional[Path], typer.Option(help="Write every completion (tokens, logprobs, "
                                                             "top-k) of each side to this JSON file.")] = None,
    api_key_file: Annotated[Optional[Path], typer.Option(help="The candidate's front key (launch --api-key-file), "
                                                         "sent to it only.")] = None,
    device: StartedDeviceOpt = "cpu",
    gdn_prefill_backend: StartedGdnBackendOpt = None,
    enforce_eager: StartedEagerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Send the same prompts to a baseline and a candidate (greedy, logprobs) and judge the candidate.

    Reports task accuracy, token agreement up to the first divergence that is not a near-tie, where
    divergences happen and the mean logprob drift. With --dataset random every prompt is judged on its own (a
    divergence that is not a near-tie, a refusal or drift over the limit fails it) and the first-token drift is
    reported; --reference measures the near-tie tolerance instead of assuming it. Exit 0: pass; 1: regression
    (the failing metric is named); 2: could not run (the reason is given).

    Examples:

      hybridserve validate                                   # single-sync vs pd-async, trained model, 64 prompts

      hybridserve validate --candidate pd-sync --junit validate.xml

      hybridserve validate --baseline http://a:8000 --candidate http://b:8000 --dataset gsm8k.jsonl --json

      hybridserve validate --baseline http://a:8000 --candidate http://b:8000 --reference http://a:8000
      --dataset random --prompt-len 1024 8192 32768 --model /models/m --max-tokens 16 --json
    """
    from hybridserve.core.validate import ValidateRequest, load_dataset, parse_target, resolve_thresholds, validate
    from hybridserve.core.deployments.client import RequestSettings
    from hybridserve.cli.validate_inputs import positive, random_model_defaults, top_k, trailing_lengths
    from hybridserve.core.deployments.target import is_random_model
    from hybridserve.core.validate.random_prompts import RANDOM, load_random
    from hybridserve.core.validate.thresholds import Thresholds
    from hybridserve.core.common.fault_kind import parse_fault
    from hybridserve.core.launch.keys import read_key
    from hybridserve.core.supervise.start_phase import default_start_timeout
    from hybridserve.core.launch.topology import Device, EngineOptions

    targets = (parse_target(baseline, what="baseline"),
               parse_target(candidate, what="candidate", fault=parse_fault(fault)))
    lengths = trailing_lengths(prompt_len, ctx.args)
    is_random = dataset == RANDOM
    if lengths and not is_random:
        raise InputError(f"--prompt-len: only with --dataset {RANDOM}")
    starts = any(t.config is not None for t in targets)
    base = Thresholds(max_regressed_prompts=0) if is_random else Thresholds()
    if starts and is_random_model(model) and not is_random:  # validate starts that model
        base, dataset = random_model_defaults(dataset)
    limits = resolve_thresholds(thresholds, base=base, overrides={
        "max_accuracy_drop": max_accuracy_drop, "min_candidate_accuracy": min_candidate_accuracy,
        "min_token_agreement": min_token_agreement, "max_logprob_drift": max_logprob_drift,
        "near_tie_tolerance": near_tie_tolerance, "max_failed_requests": max_failed_requests})
    request = ValidateRequest(
        baseline=targets[0], candidate=targets[1], thresholds=limits,
        dataset=(load_random(lengths, num_prompts=num_prompts, seed=seed, model=model, is_started=starts)
                 if is_random else load_dataset(dataset, num_prompts=num_prompts, seed=seed)),
        reference=None if reference is None else parse_target(reference, what="reference"),
        settings=RequestSettings(max_tokens=positive(max_tokens, "--max-tokens"), timeout_s=timeout or 300.0,
                                 concurrency=positive(concurrency, "--concurrency"),
                                 ignore_eos=ignore_eos or is_random, model=served_model, is_token_ids=is_random,
                                 num_top_logprobs=top_k(top_logprobs, is_random),
                                 api_key=read_key(api_key_file, what="--api-key-file") if api_key_file else None),
        model=model, base_port=base_port, run_root=run_dir, num_cores=os.cpu_count() or 1,
        start_timeout_s=timeout or default_start_timeout(Device.parse(device)), device=Device.parse(device).value,
        engine=EngineOptions(gdn_prefill_backend=gdn_prefill_backend, is_enforce_eager=enforce_eager))
    if save_completions is not None and not save_completions.parent.is_dir():
        raise InputError(f"--save-completions {save_completions}: no folder {save_completions.parent}; "
                         "accepted: a file in an existing folder")
    report = _run_with_progress(request)
    if junit is not None:
        from hybridserve.core.validate.junit import write_junit
        write_junit(junit, report.verdict, suite_name="hybridserve.validate", elapsed_s=report.elapsed_s)
    if save_completions is not None:
        from hybridserve.core.validate.evidence import write_completions
        write_completions(save_completions, report)
    from hybridserve.cli.validate_render import render, report_dict
    print_json(report_dict(report)) if as_json else render(out_console, report)
    if not report.verdict.passed:
        raise CheckFailedError(report.verdict.summary)


def _run_with_progress(request):  # noqa: ANN001, ANN202
    from hybridserve.cli.phase_progress import run_with_phase_progress
    from hybridserve.core.validate import validate

    return run_with_phase_progress(lambda on_progress: validate(request, on_progress), before="the verdict",
                                   starting=" (starting / sending)")
