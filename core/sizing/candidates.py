"""The deployments `plan` weighs for N GPUs (or GPU shares, or cores): aggregated replicas at each TP, and every
xPyD with a TP per role that uses exactly N, each engine built from the project's layout (the same seam launch
uses: core/launch/instance_cache.py) and the step profile.

Capacity: the blocks one engine holds, from the profile (what the measured engine reported) at the profile's TP;
at another TP from the layout at that TP, the weights split over its ranks (core/layout/capacity.py's estimate).
Transfer: one request's READ, priced by vLLM's scheme after NIXL's merge (core/layout/descriptors.py) at the
prompt's length plus the first token from prefill.
Step times at a TP the profile did not measure are extrapolated (the per-token, per-request and attention work
split over the ranks, the step's fixed cost kept, no all-reduce cost): a prediction beyond what was measured, and
each such candidate says so.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from hybridserve.core.common.errors import InputError
from hybridserve.core.launch.instance_cache import instance_cache
from hybridserve.core.launch.topology import Device, EngineInstance, EngineOptions, RoutingPolicy
from hybridserve.core.layout.capacity import Capacity, estimate_weights_bytes
from hybridserve.core.layout.descriptors import Scheme, transfer_cost
from hybridserve.core.layout.rank_layout import RankLayout
from hybridserve.core.model.spec import ModelSpec
from hybridserve.core.sizing.simulate import EngineSpec, SimDeployment
from hybridserve.core.sizing.step_profile import StepCoefficients, StepProfile


@dataclass(frozen=True, kw_only=True)
class Candidate:
    name: str  # "2 replicas TP1", "1P1D TP1/TP1"
    num_replicas: int = 0
    replica_tp: int = 0
    num_prefill: int = 0
    prefill_tp: int = 0
    num_decode: int = 0
    decode_tp: int = 0

    @property
    def is_pd(self) -> bool:
        return self.num_prefill > 0

    @property
    def num_units(self) -> int:
        return self.num_replicas * self.replica_tp + self.num_prefill * self.prefill_tp + self.num_decode * self.decode_tp

    @property
    def tps(self) -> tuple[int, ...]:
        return (self.prefill_tp, self.decode_tp) if self.is_pd else (self.replica_tp,)


def enumerate_candidates(num_units: int, tps: tuple[int, ...]) -> list[Candidate]:
    if num_units < 1:
        raise InputError(f"--gpus count {num_units}: accepted: 1 or more")
    out = [Candidate(name=f"{num_units // t} replica{'s' if num_units // t > 1 else ''} TP{t}",
                     num_replicas=num_units // t, replica_tp=t) for t in tps if num_units % t == 0]
    for tp_p in tps:
        for tp_d in tps:
            for x in range(1, num_units // tp_p + 1):
                rest = num_units - x * tp_p
                if rest >= tp_d and rest % tp_d == 0:
                    y = rest // tp_d
                    out.append(Candidate(name=f"{x}P{y}D TP{tp_p}/TP{tp_d}", num_prefill=x, prefill_tp=tp_p,
                                         num_decode=y, decode_tp=tp_d))
    return out


class EngineBuilder:
    """Engines of one model, device and profile at any TP (cached per TP)."""

    def __init__(self, model: ModelSpec, profile: StepProfile, engine: EngineOptions | None = None) -> None:
        self.model, self.profile = model, profile
        self.device = Device.parse(profile.device)
        self.engine = engine or EngineOptions()

    @functools.cache  # noqa: B019 (one builder per plan call)
    def layout(self, tp: int) -> RankLayout:
        cache = instance_cache(self.model, self.device, self.engine, EngineInstance(port=1, side_channel_port=2, tp=tp))
        return cache.layout

    def num_blocks(self, tp: int) -> int:
        if tp == self.profile.tp:
            return self.profile.num_blocks
        measured = self.layout(self.profile.tp)
        kv_bytes = self.profile.num_blocks * measured.page_size_bytes * measured.num_tensors
        freed = estimate_weights_bytes(self.model, self.profile.tp) - estimate_weights_bytes(self.model, tp)
        layout = self.layout(tp)
        return max(0, kv_bytes + freed) // layout.page_size_bytes // layout.num_tensors

    def coefficients(self, tp: int, load_factor: float = 1.0) -> StepCoefficients:
        """The profile's step costs at `tp` (extrapolated where it did not measure it), times `load_factor`."""
        c = self.profile.coefficients
        scale = self.profile.tp / tp
        return replace(c, base_s=c.base_s * load_factor, token_s=c.token_s * scale * load_factor,
                       seq_s=c.seq_s * scale * load_factor, attention_s=c.attention_s * scale * load_factor)

    def spec(self, tp: int, load_factor: float = 1.0) -> EngineSpec:
        layout = self.layout(tp)
        blocks = functools.lru_cache(maxsize=None)(lambda tokens: Capacity.blocks_per_request(
            Capacity(weights_bytes=0, kv_cache_bytes=0, num_blocks=0), layout, tokens))
        return EngineSpec(coefficients=self.coefficients(tp, load_factor), limits=self.profile.limits,
                          num_blocks=self.num_blocks(tp), blocks_for=blocks)

    def transfer_s(self, prefill_tp: int, decode_tp: int):  # noqa: ANN201 (prompt tokens -> seconds)
        prefill, decode = self.layout(prefill_tp), self.layout(decode_tp)
        if prefill.block_size != decode.block_size:
            raise InputError(f"TP{prefill_tp} prefill and TP{decode_tp} decode get {prefill.block_size}- and "
                             f"{decode.block_size}-token blocks; vLLM needs them equal")
        price = self.profile.transfer

        @functools.lru_cache(maxsize=None)
        def seconds(prompt_tokens: int) -> float:
            cost = transfer_cost(prefill, decode, prompt_tokens + 1, Scheme.VLLM)  # + token 1, from prefill
            return price.transfer_s(descriptors=cost.served_descriptors, num_bytes=cost.total_bytes)
        return seconds

    def deployment(self, candidate: Candidate, policy: RoutingPolicy,
                   load_factor: float | None = None) -> SimDeployment:
        """`load_factor`: None: the profile's for the candidate's kind (replicas or pd), else 1."""
        http_s = self.profile.coefficients.http_s
        kind = "pd" if candidate.is_pd else "replicas"
        f = self.profile.load_factors.get(kind, 1.0) if load_factor is None else load_factor
        if not candidate.is_pd:
            return SimDeployment(replica=self.spec(candidate.replica_tp, f), num_replicas=candidate.num_replicas,
                                 http_s=http_s, policy=policy)
        return SimDeployment(prefill=self.spec(candidate.prefill_tp, f), num_prefill=candidate.num_prefill,
                             decode=self.spec(candidate.decode_tp, f), num_decode=candidate.num_decode,
                             transfer_s=self.transfer_s(candidate.prefill_tp, candidate.decode_tp), http_s=http_s,
                             policy=policy)

    def beyond_measured(self, candidate: Candidate) -> list[str]:
        """Why this candidate's numbers rest on more than the profile measured."""
        return [f"TP{t} extrapolated from the TP{self.profile.tp} profile" for t in sorted(set(candidate.tps))
                if t != self.profile.tp]
