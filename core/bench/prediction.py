"""`plan`'s prediction beside the served stats: per transfer, the mean over the phase's prompts (requests and
probes: each moves its state in one transfer per remote rank), each predicted at its own length, so it compares
with the phase's mean of decode's `vllm:nixl_num_descriptors` histogram (server_metrics.py: the sum over the
phase's transfers by their count).

The layouts come from the same seam `launch` and `plan` use (core/launch/instance_cache.py -> core/layout): the
first prefill and decode instance of launch's local topology for this model, device and engine options, so a
deployment `bench` starts is predicted with the settings it was started with. The count is vLLM's scheme
(core/layout/descriptors.py `transfer_cost`) after NIXL's merge, what `vllm:nixl_num_descriptors` reports.

How the merge falls depends on the block ids the server hands out, so on what it served before (vLLM's LIFO free
queue, core/layout/served.py). A phase whose requests go one at a time (idle load, no probes) is predicted request
by request from every request the deployment served earlier in this run (earlier phases included, in send order,
with their output lengths), from a fresh server: `HISTORY` when bench started the deployment, `FRESH_ASSUMPTION`
for a URL (bench cannot know what it served before). Requests in flight together (a concurrency above 1, a rate,
probes beside the load) free their blocks interleaved, which that model does not follow: such a phase, and every
phase after it, gets `RANGE`, from a fresh server's first request (every group one run) to the fragmented bound
(a run per block).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from hybridserve.core.launch.instance_cache import instance_cache
from hybridserve.core.launch.topology import Device, EngineOptions, local_topology
from hybridserve.core.layout.descriptors import Scheme, transfer_cost
from hybridserve.core.layout.served import runs_of_requests
from hybridserve.core.model.profiles import load_model

FIRST_REQUEST = "fresh server's first request"
HISTORY = "this run's request history"
FRESH_ASSUMPTION = "fresh-server assumption"
RANGE = "range"


@dataclass(frozen=True, kw_only=True)
class Prediction:
    """Means over a phase's prompts (each request predicted at its own length; one length: that request)."""

    mean_prompt_tokens: float
    num_reads: int  # NIXL READs (transfers) per request and decode rank
    descriptors: float  # per transfer, after NIXL's merge; a range's low end
    is_served_count: bool  # whether `descriptors` is the count after NIXL's merge
    unmerged_descriptors: float | None
    fragmented_descriptors: float | None
    bytes: float  # per transfer
    basis: str = FIRST_REQUEST  # how the block ids were taken: FIRST_REQUEST, HISTORY, FRESH_ASSUMPTION or RANGE
    descriptors_max: float | None = None  # a range's high end (the fragmented bound); None: one value
    fresh_descriptors: float | None = None  # each request as a fresh server's first, for comparison
    why: str = ""  # what the basis rests on, in words

    @property
    def is_range(self) -> bool:
        return self.descriptors_max is not None


class Predictor:
    """The prefill and decode layouts of launch's local topology for a model, device and engine options.

    `is_first_token_from_prefill`: the deployment's proxy takes token 1 from prefill (core/proxy/first_token.py), so
    its servers see each request as (prompt + 1, output - 1): prefill holds N tokens, not vLLM's N - 1."""

    def __init__(self, model: Path, *, device: Any = None, engine: Any = None,
                 is_first_token_from_prefill: bool = False) -> None:
        self.shift = 1 if is_first_token_from_prefill else 0

        device = device or Device.CPU
        engine = engine or EngineOptions()
        spec = load_model(str(model))
        topology = local_topology(model=model, device=device, engine=engine)
        self.prefill = instance_cache(spec, device, engine, topology.prefill[0]).layout
        self.decode = instance_cache(spec, device, engine, topology.decode[0]).layout

    def _costs(self, prompt_lens: Sequence[int], runs: Sequence[int] | None = None) -> list:
        return [transfer_cost(self.prefill, self.decode, n + self.shift, Scheme.VLLM,
                              served_runs=None if runs is None else r)
                for n, r in zip(prompt_lens, runs or [None] * len(prompt_lens), strict=True)]

    def predict(self, prompt_lens: Sequence[int]) -> Prediction:
        """Each request as a fresh server's first (every attention group one run)."""
        return self._prediction(prompt_lens, self._costs(prompt_lens))

    def predict_range(self, prompt_lens: Sequence[int], why: str) -> Prediction:
        """From a fresh server's first request to the fragmented bound, where the block ids cannot be followed."""
        costs = self._costs(prompt_lens)
        fresh = self._prediction(prompt_lens, costs)
        return self._prediction(prompt_lens, costs, basis=RANGE, why=why,
                                descriptors_max=fresh.fragmented_descriptors)

    def predict_phases(self, works: Sequence[Any], *, is_started: bool) -> list[Prediction]:
        """One prediction per phase of a run, in order, on one deployment (PhaseWork: lengths, load, probes).
        `is_started`: bench started the deployment (fresh); False: a URL, assumed fresh when the run began."""

        served: list[tuple[int, int]] = []  # what the deployment served before, in send order
        first_concurrent = next((i for i, w in enumerate(works) if not _is_sequential(w)), len(works))
        for work in works[:first_concurrent]:
            served += [(n + self.shift, out - self.shift)
                       for n, out in zip(work.input_lens, work.output_lens, strict=True)]
        runs = runs_of_requests(self.prefill, self.decode, served)
        out, start = [], 0
        for i, work in enumerate(works):
            if i >= first_concurrent:
                why = ("requests in flight together free their blocks interleaved" if i == first_concurrent else
                       f"after phase {first_concurrent + 1}'s concurrent requests the free queue is not followed")
                out.append(self.predict_range(work.all_input_lens, why))
                continue
            lens, phase_runs = work.input_lens, runs[start:start + len(work.input_lens)]
            before, start = start, start + len(lens)
            why = f"after {before} earlier request(s) of this run, one at a time, on a server " + (
                "bench started" if is_started else "assumed fresh when bench began (given by URL)")
            fresh = self._prediction(lens, self._costs(lens))
            out.append(self._prediction(lens, self._costs(lens, phase_runs), basis=HISTORY if is_started
                                        else FRESH_ASSUMPTION, why=why, fresh_descriptors=fresh.descriptors))
        return out

    def _prediction(self, prompt_lens: Sequence[int], costs: list, **extra: Any) -> Prediction:
        reads = costs[0].num_reads

        def mean(values: list[float]) -> float:  # per transfer: each request makes `reads` of equal count
            return sum(values) / len(values) / reads

        return Prediction(
            mean_prompt_tokens=sum(prompt_lens) / len(prompt_lens), num_reads=reads,
            descriptors=mean([c.served_descriptors for c in costs]), is_served_count=True,
            unmerged_descriptors=mean([c.unmerged_descriptors for c in costs]),
            fragmented_descriptors=mean([c.fragmented_descriptors for c in costs]),
            bytes=mean([c.total_bytes for c in costs]), **extra)


def _is_sequential(work: Any) -> bool:
    """One request at a time, nothing beside it: vLLM frees each request's blocks before the next allocates."""
    return work.spec.load.is_idle and work.spec.probe is None
