"""What the chaos bench judges answers against: one server's greedy answer to each prompt of the load's pool.

The server is the deployment's prefill, asked directly with plain requests (no kv_transfer_params: it computes the
whole answer alone, as a single server does), before any kill. It is asked twice, the second time in reverse order,
and the two passes set the near-tie tolerance and the drift limit as validate measures them (core/validate/noise.py,
run.measured_limits), never below `floor` (validate's defaults: on one CPU server two passes are often identical,
while P/D moves logprobs by bf16 noise: the first token comes from prefill, the rest from decode).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import httpx

from hybridserve.core.deployments.client import Completion, parse_completion
from hybridserve.core.validate import synthetic
from hybridserve.core.validate.noise import Noise, measure
from hybridserve.core.validate.thresholds import Thresholds

POOL_SEED = 39


def prompt_pool(num_prompts: int, *, min_words: int = 60, max_words: int = 120) -> list[str]:
    """The recall task's prompts (core/validate/synthetic.py), short: every tokenizer the bench meets fits them in
    max_model_len, and the trained recall model answers them with wide top-2 gaps."""
    return [e.prompt_text for e in synthetic.make_examples(POOL_SEED, num_prompts, min_words=min_words,
                                                             max_words=max_words)]


def _ask(client: httpx.Client, url: str, body: dict) -> Completion:
    response = client.post(f"{url}/v1/completions", json={**body, "stream": False})
    if response.status_code != 200:
        raise RuntimeError(f"reference server {url} answered HTTP {response.status_code}: {response.text[:300]}")
    return parse_completion(url, response.json())


def _ask_all(url: str, bodies: list[dict], *, timeout_s: float, concurrency: int) -> list[Completion]:
    with httpx.Client(timeout=timeout_s) as client, ThreadPoolExecutor(max_workers=concurrency) as pool:
        return list(pool.map(lambda body: _ask(client, url, body), bodies))


def _widened(thresholds: Thresholds, noise: Noise) -> Thresholds:
    """The near-tie tolerance and the drift limit, never below what `noise` measured."""
    return replace(thresholds, near_tie_tolerance=max(thresholds.near_tie_tolerance, noise.tolerance),
                   max_logprob_drift=max(thresholds.max_logprob_drift, noise.max_logprob_drift))


def references(url: str, bodies: list[dict], floor: Thresholds, *, timeout_s: float = 120.0,
               concurrency: int = 1) -> tuple[list[Completion], Thresholds, Noise]:
    """(the answers, in pool order; the thresholds to judge with; the noise of two passes), `concurrency` at once."""
    first = _ask_all(url, bodies, timeout_s=timeout_s, concurrency=concurrency)
    second = _ask_all(url, bodies[::-1], timeout_s=timeout_s, concurrency=concurrency)[::-1]
    noise = measure(url, first, second)
    return first, _widened(floor, noise), noise


def widen_by_other_engine(url: str, bodies: list[dict], answers: list[Completion], thresholds: Thresholds, *,
                          timeout_s: float = 120.0, concurrency: int = 1) -> tuple[Thresholds, Noise]:
    """The same prompts computed by another engine alone (decode, with plain requests: what it computes when it
    refuses a READ), against the reference's answers; the limits widened to that noise too. Two passes on one engine
    do not see what another engine's batches and graphs move, and a random-weight model (near-uniform logits, the
    H200's 60 layers) flips a near-tie on less. On CPU decode's pass equalled prefill's (noise 0, 2026-12-05)."""
    noise = measure(url, answers, _ask_all(url, bodies, timeout_s=timeout_s, concurrency=concurrency))
    return _widened(thresholds, noise), noise
