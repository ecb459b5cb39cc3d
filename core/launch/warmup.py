"""The warm-up burst: what launch sends each engine once it is healthy, before the role counts as serving.

A fresh vLLM server reports healthy before it has run the steps a first burst of traffic brings. On an H100
(2026-12-08, vLLM 0.26, the 60-layer model, launch's CUDA defaults) a first burst of 32 requests waited a TTFT p90 of
13.0 s, the same burst again 3.25 s. vLLM's JIT monitor names it: "CuTeDSL JIT compilation during inference:
_FullyFusedDeltaRuleSm90", FlashInfer 0.6.14's GDN prefill for a step of several sequences (gdn_prefill.py: the
context-parallel path serves one sequence alone; vLLM 0.26 warms only that one, `_warmup_prefill_kernels`), compiled
in 8.7 s at its first call into a cache that lives in the process (delta_rule_dsl/custom_compile_cache.py): every
start and restart paid it. With this burst (10.0 s) the first burst's p90 was 0.98x the same burst again
(BENCHMARKS.md, "The first burst after a start").

So the burst is the shape of a first burst, sent all at once: several sequences in one prefill step, prompts
longer than FlashInfer's 4,096-token context-parallel chunk and than vLLM's 8,192-token step (a chunk that
continues a prompt from its state), and decode steps of many sequences beside prefill chunks. Lengths stop at the
engine's context. On by default on CUDA; off on CPU (the demo's tiny model has no JIT kernels to compile; `--warmup`
turns it on there too).
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridserve.core.launch.topology import Device

# prompt tokens of the burst's requests, all sent at once (those past the engine's context are left out)
PROMPT_TOKENS = (16, 256, 1024, 3000, 5000, 9000, 12000, 17000)
MAX_TOKENS = 16  # each request's output: decode steps of every sequence at once, beside the later prefill chunks
MIN_REQUESTS = 2  # fewer is no burst: one sequence per step is what vLLM's own warm-up already runs
HELP = "A burst to each engine once healthy (and restarted), before it serves. Default: CUDA on, CPU off."


@dataclass(frozen=True, kw_only=True)
class WarmupBurst:
    prompt_tokens: tuple[int, ...]  # one request each, all at once
    max_tokens: int
    reason: str

    @property
    def num_requests(self) -> int:
        return len(self.prompt_tokens)

    def what(self) -> str:
        """The requests, for the progress line."""
        lengths = ", ".join(f"{n:,}" for n in self.prompt_tokens)
        return f"warm-up: {self.num_requests} requests at once (prompts of {lengths} tokens, {self.max_tokens} out each)"

    def line(self) -> str:
        """For the dry run: the requests and why."""
        return f"{self.what()} before it counts as serving: {self.reason}"


def is_on(device: Device, asked: bool | None) -> bool:
    """`asked`: --warmup / --no-warmup; None: the device's default (CUDA on, CPU off)."""
    return asked if asked is not None else device is Device.CUDA


def warmup_burst(device: Device, asked: bool | None, *, max_context_tokens: int | None) -> WarmupBurst | None:
    """The burst an engine gets, or None (is_on). `max_context_tokens`: the engine's context (its --max-model-len,
    else the model's; None: not known)."""
    if not is_on(device, asked):
        return None
    limit = (max_context_tokens - MAX_TOKENS) if max_context_tokens is not None else None
    lengths = tuple(n for n in PROMPT_TOKENS if limit is None or n <= limit)
    if limit is not None and len(lengths) < MIN_REQUESTS:
        lengths = tuple(sorted({max(1, limit // 2), max(1, limit)}))
    reason = ("asked (--warmup)" if asked else
              "CUDA's default: a fresh server compiles kernels on its first multi-sequence steps (--no-warmup skips)")
    return WarmupBurst(prompt_tokens=lengths, max_tokens=MAX_TOKENS, reason=reason)
