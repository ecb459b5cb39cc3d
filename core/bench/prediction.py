"""`plan`'s prediction beside the served stats: per transfer, the mean over the phase's prompts (requests and
probes: each moves its state in one transfer per remote rank), each predicted at its own length, so it compares
with the means of decode's histograms; for one fixed length it is that length's transfer.

The layouts come from the same seam `launch` and `plan` use (core/launch/instance_cache.py -> core/layout): the
first prefill and decode instance of launch's local topology for this model, device and engine options, so a
deployment `bench` starts is predicted with the settings it was started with. The count is vLLM's scheme
(core/layout/descriptors.py `transfer_cost`): `served_descriptors` (after NIXL's merge of dense runs, what
`vllm:nixl_num_descriptors` reports) where the layout library has it, else its descriptor-id count.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, kw_only=True)
class Prediction:
    """Means over a phase's prompts (each request predicted at its own length; one length: that request)."""

    mean_prompt_tokens: float
    num_reads: int  # NIXL READs (transfers) per request and decode rank
    descriptors: float  # per transfer: served (merged) count when known, else vLLM's descriptor ids
    is_served_count: bool  # whether `descriptors` is the count after NIXL's merge
    unmerged_descriptors: float | None
    fragmented_descriptors: float | None
    bytes: float  # per transfer


class Predictor:
    """The prefill and decode layouts of launch's local topology for a model, device and engine options."""

    def __init__(self, model: Path, *, device: Any = None, engine: Any = None) -> None:
        from hybridserve.core.launch.instance_cache import instance_cache
        from hybridserve.core.launch.topology import Device, EngineOptions, local_topology
        from hybridserve.core.model.profiles import load_model

        device = device or Device.CPU
        engine = engine or EngineOptions()
        spec = load_model(str(model))
        topology = local_topology(model=model, device=device, engine=engine)
        self.prefill = instance_cache(spec, device, engine, topology.prefill[0]).layout
        self.decode = instance_cache(spec, device, engine, topology.decode[0]).layout

    def predict(self, prompt_lens: tuple[int, ...]) -> Prediction:
        from hybridserve.core.layout.descriptors import Scheme, transfer_cost

        costs = [transfer_cost(self.prefill, self.decode, n, Scheme.VLLM) for n in prompt_lens]
        reads = costs[0].num_reads

        def mean(values: list[float]) -> float:
            return sum(values) / len(values) / reads

        served = [getattr(c, "served_descriptors", None) for c in costs]  # the merged count, where it is known
        is_served = all(v is not None for v in served)
        fragmented = [getattr(c, "fragmented_descriptors", None) for c in costs]
        return Prediction(
            mean_prompt_tokens=sum(prompt_lens) / len(prompt_lens), num_reads=reads,
            descriptors=mean(served if is_served else [c.total_descriptors for c in costs]),
            is_served_count=is_served,
            unmerged_descriptors=mean([getattr(c, "unmerged_descriptors", c.total_descriptors) for c in costs])
            if is_served else None,
            fragmented_descriptors=mean(fragmented) if all(v is not None for v in fragmented) else None,
            bytes=mean([c.total_bytes for c in costs]))
