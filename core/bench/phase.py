"""What one phase sends: its load, how many requests of which lengths, and optional probes sent under the load.

A probe measures one long prompt's TTFT while the phase's load runs: once `after_requests` of the phase's requests
have finished, the probes are sent one after another (each waits for the one before), beside the load, and are
summarized apart from it. The issue's load "48 requests of 500-12,000 tokens, 16 at a time, then three 32k
prompts sent while 32 more ran" is: 48 requests, concurrency 16, input 500:12000, 3 probes of 32768 after 16.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from hybridserve.core.bench.lengths import LengthDist
from hybridserve.core.bench.load import Load, arrival_offsets
from hybridserve.core.common.errors import InputError


@dataclass(frozen=True, kw_only=True)
class ProbeSpec:
    num_probes: int
    input_tokens: int
    output_tokens: int
    after_requests: int  # sent once this many of the phase's requests have finished


@dataclass(frozen=True, kw_only=True)
class PhaseSpec:
    load: Load
    num_requests: int
    input_len: LengthDist
    output_len: LengthDist
    probe: ProbeSpec | None = None

    @property
    def name(self) -> str:
        probe = f", {self.probe.num_probes} x {self.probe.input_tokens} probes" if self.probe else ""
        return f"{self.load.name}, in {self.input_len}, out {self.output_len}{probe}"


@dataclass(frozen=True, kw_only=True)
class PhaseWork:
    """The drawn requests of a phase: the same for every target of a run."""

    spec: PhaseSpec
    input_lens: tuple[int, ...]
    output_lens: tuple[int, ...]
    offsets_s: tuple[float, ...]  # earliest send time of each request after the phase starts

    @property
    def all_input_lens(self) -> tuple[int, ...]:
        """The requests' prompt lengths, then the probes'."""
        probe = self.spec.probe
        return self.input_lens + ((probe.input_tokens,) * probe.num_probes if probe else ())

    @property
    def mean_input_tokens(self) -> float:
        return sum(self.input_lens) / len(self.input_lens)


def draw_work(spec: PhaseSpec, rng: random.Random) -> PhaseWork:
    return PhaseWork(spec=spec, input_lens=spec.input_len.sample(rng, spec.num_requests),
                     output_lens=spec.output_len.sample(rng, spec.num_requests),
                     offsets_s=arrival_offsets(spec.load, spec.num_requests, rng))


def check_phase(spec: PhaseSpec, max_model_len: int | None) -> None:
    """Refuse what cannot run: no requests, probes after more requests than the phase has, or lengths the
    server's context does not hold (vLLM refuses a prompt + max_tokens beyond --max-model-len)."""
    if spec.num_requests < 1:
        raise InputError(f"--num-requests {spec.num_requests}: accepted: 1 or more")
    longest = spec.input_len.max_tokens + spec.output_len.max_tokens
    probe = spec.probe
    if probe is not None:
        if probe.input_tokens < 1 or probe.output_tokens < 1:
            raise InputError(f"--probe-len {probe.input_tokens} --probe-output-len {probe.output_tokens}: "
                             "accepted: 1 or more tokens each")
        if probe.num_probes < 1 or not 0 <= probe.after_requests <= spec.num_requests:
            raise InputError(f"--probes {probe.num_probes} --probe-after {probe.after_requests}: accepted: 1 or "
                             f"more probes after 0 to {spec.num_requests} finished requests")
        longest = max(longest, probe.input_tokens + probe.output_tokens)
    if max_model_len is not None and longest > max_model_len:
        raise InputError(f"--input-len/--output-len/--probe-len: {longest} tokens (prompt + output) do not fit the "
                         f"server's max_model_len {max_model_len}; accepted: at most {max_model_len}")
