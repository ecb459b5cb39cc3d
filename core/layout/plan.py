"""`plan`: the layout on prefill and decode ranks, capacity, and per-prompt transfer cost in both schemes."""

from __future__ import annotations

from dataclasses import dataclass, replace

from hybridserve.core.layout.capacity import Capacity, MemoryBudget, plan_capacity
from hybridserve.core.layout.descriptors import Scheme, TransferCost, transfer_cost
from hybridserve.core.common.errors import InputError
from hybridserve.core.layout.rank_layout import MAX_CONTEXT_TOKENS, LayoutRequest, RankLayout, plan_layout
from hybridserve.core.layout.served import ServedScenario, mean_served_runs


@dataclass(frozen=True, kw_only=True)
class PlanRequest:
    layout: LayoutRequest  # its `tp` is the prefill TP
    decode_tp: int | None = None  # None: same as prefill
    prompt_tokens: tuple[int, ...] = (1024, 8192, 32768)
    num_runs: int = 1  # fragmentation of a request's blocks, for our scheme
    budget: MemoryBudget | None = None
    served: ServedScenario = ServedScenario()  # how the fresh server whose merged count vLLM's column shows is driven


@dataclass(frozen=True, kw_only=True)
class RequestPlan:
    prompt_tokens: int
    vllm: TransferCost
    ours: TransferCost
    max_requests: int | None  # on one decode rank; None without a memory budget
    # what vLLM would log as its maximum concurrency with --max-model-len at this prompt's length (capacity.py)
    vllm_max_concurrency: float | None = None


@dataclass(frozen=True, kw_only=True)
class Plan:
    request: PlanRequest
    prefill: RankLayout
    decode: RankLayout
    capacity: Capacity | None  # of a decode rank
    requests: tuple[RequestPlan, ...]


def make_plan(request: PlanRequest) -> Plan:
    for n in request.prompt_tokens:
        if not 1 <= n <= MAX_CONTEXT_TOKENS:
            raise InputError(f"--prompt-len {n}: accepted: 1-{MAX_CONTEXT_TOKENS} tokens")
    if request.num_runs < 1:
        raise InputError(f"--runs {request.num_runs}: accepted: 1 or more contiguous runs")
    prefill = plan_layout(request.layout)
    decode_tp = request.decode_tp or request.layout.tp
    decode = prefill if decode_tp == request.layout.tp else plan_layout(replace(request.layout, tp=decode_tp))
    _check_same_blocks(prefill, decode)
    capacity = plan_capacity(decode, request.budget) if request.budget else None
    served = mean_served_runs(prefill, decode, request.prompt_tokens, request.served)
    return Plan(request=request, prefill=prefill, decode=decode, capacity=capacity,
                requests=tuple(_request_plan(prefill, decode, capacity, n, request.num_runs, served[n])
                               for n in request.prompt_tokens))


def _request_plan(prefill: RankLayout, decode: RankLayout, capacity: Capacity | None, tokens: int,
                  runs: int, served_runs: float) -> RequestPlan:
    return RequestPlan(
        prompt_tokens=tokens,
        vllm=transfer_cost(prefill, decode, tokens, Scheme.VLLM, served_runs=served_runs),
        ours=transfer_cost(prefill, decode, tokens, Scheme.OURS, num_runs=runs),
        max_requests=capacity.max_requests(decode, tokens) if capacity else None,
        vllm_max_concurrency=capacity.vllm_max_concurrency(decode, tokens) if capacity else None,
    )


def _check_same_blocks(prefill: RankLayout, decode: RankLayout) -> None:
    """vLLM's hybrid allocator over NIXL needs the same logical block size on both sides (block_size_ratio 1)."""
    if prefill.block_size == decode.block_size:
        return
    start = max(prefill.block_size, decode.block_size)
    why = (f"--decode-tp {decode.request.tp}: prefill TP{prefill.request.tp} gets {prefill.block_size}-token blocks, "
           f"decode TP{decode.request.tp} gets {decode.block_size}; vLLM needs them equal")
    size = _common_block_size(prefill.request, decode.request, start)
    if size is None:
        raise InputError(f"{why}, and no --block-size from {start} to {16 * start} gives both the same: "
                         f"accepted: --decode-tp {prefill.request.tp}")
    raise InputError(f"{why}: accepted: --block-size {size}")


def _common_block_size(prefill: LayoutRequest, decode: LayoutRequest, start: int) -> int | None:
    """The smallest --block-size (multiples of 16 from `start`, up to 16x) for which both sides' layouts, planned
    with it, have equal logical blocks; None when none does. Only a size both layouts confirmed is suggested."""
    for candidate in range(start, 16 * start + 1, 16):
        try:
            a = plan_layout(replace(prefill, block_size=candidate))
            b = plan_layout(replace(decode, block_size=candidate))
        except InputError:  # a side's backend refuses this size (e.g. not a multiple of its kernel block)
            continue
        if a.block_size == b.block_size:
            return candidate
    return None
