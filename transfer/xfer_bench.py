"""`transfer bench`: move requests between rank processes over NIXL with both schemes, check, and time them.

For each prompt length and scheme, K requests with contiguous block ids and K with fragmented (random) ids
are READ by every decode rank; every byte of every decode region is checked after each request; the same
number of bytes is also copied inside one process (the memcpy bound) for comparison.
"""

from __future__ import annotations

import enum
import importlib.util
import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from hybridserve.core.layout.attention_backend import AttentionBackend
from hybridserve.core.layout.descriptors import Scheme, transfer_cost
from hybridserve.core.layout.served import attention_runs
from hybridserve.core.model.dtypes import DType
from hybridserve.core.common.errors import CheckFailedError, CouldNotRunError, InputError, MissingExtraError
from hybridserve.core.common.ucx import Transport
from hybridserve.core.layout.rank_layout import LayoutRequest
from hybridserve.core.layout.plan import PlanRequest, make_plan
from hybridserve.core.model.spec import ModelSpec
from hybridserve.transfer.blocks import Allocation, BlockPool, allocate, blocks_per_group
from hybridserve.transfer.cluster import Cluster
from hybridserve.transfer.geometry import runs
from hybridserve.transfer.ucx_capture import UcxCapture


class Memory(enum.Enum):
    DRAM = "dram"
    VRAM = "vram"


@dataclass(frozen=True, kw_only=True)
class BenchRequest:
    model: ModelSpec
    prefill_tp: int = 1
    decode_tp: int = 1
    prompt_tokens: tuple[int, ...] = (1024, 8192, 32768)
    schemes: tuple[Scheme, ...] = (Scheme.VLLM, Scheme.OURS)
    memory: Memory = Memory.DRAM
    num_requests: int = 2
    backend: AttentionBackend = AttentionBackend.FLASHINFER
    block_size: int | None = None
    ssm_dtype: DType | None = None
    num_speculative_tokens: int = 0
    timeout_s: float = 60.0
    ucx_log: Path | None = None  # keep the rank processes' UCX output (protocol report) here


@dataclass(frozen=True, kw_only=True)
class BenchRow:
    """Medians over the requests of one (prompt, scheme, allocation); times per request, all decode ranks."""

    prompt_tokens: int
    scheme: str
    allocation: str
    num_requests: int
    num_descriptors: int  # per decode rank, rows (a strided row counts once)
    num_elements: int  # per decode rank, what the transfers carry after NIXL expands strided rows
    num_merged: int | None  # per decode rank, after NIXL's merge (telemetry descCount), mean over the requests
    predicted_descriptors: int  # core's count after NIXL's merge for these ids (transfer_cost served_descriptors)
    num_bytes: int  # all decode ranks
    prepare_ms: float
    post_ms: float
    transfer_ms: float
    gbps: float
    copy_gbps: float  # the same bytes per rank copied inside one process
    is_exact: bool
    transport: str | None = None  # from UCX's protocol report: cuda_ipc, cma, tcp...; None: none printed

    @property
    def is_tcp_fallback(self) -> bool:
        """The data went over TCP (loopback) instead of cuda_ipc / cma: ~0.5 GB/s for VRAM on an H200."""
        return self.transport == Transport.TCP.value


@dataclass(frozen=True, kw_only=True)
class BenchResult:
    model: str
    prefill_tp: int
    decode_tp: int
    memory: str
    backend: str
    block_size: int
    kernel_block_size: int
    page_size_bytes: int
    num_tensors: int
    rows: tuple[BenchRow, ...]


def num_steps(request: BenchRequest) -> int:
    return len(request.prompt_tokens) * len(request.schemes) * len(Allocation) * request.num_requests


def run_bench(request: BenchRequest, *, on_step: Callable[[str], None] | None = None) -> BenchResult:
    for module in ("torch", "nixl"):
        if importlib.util.find_spec(module) is None:
            raise MissingExtraError(module, "cpu" if request.memory is Memory.DRAM else "cuda", "transfer bench")
    if request.num_requests < 1:
        raise InputError(f"--requests {request.num_requests}: accepted: 1 or more")
    require_memory(request.memory)
    layout = LayoutRequest(model=request.model, tp=request.prefill_tp, backend=request.backend,
                           block_size=request.block_size, ssm_dtype=request.ssm_dtype,
                           num_speculative_tokens=request.num_speculative_tokens)
    plan = make_plan(PlanRequest(layout=layout, decode_tp=request.decode_tp, prompt_tokens=request.prompt_tokens))
    need = max(sum(blocks_per_group(plan.decode, n)) for n in request.prompt_tokens)
    num_blocks = 1 + need + need // 2 + 2  # room for fragmented ids to scatter
    rows = []
    capture = UcxCapture(memory="cuda" if request.memory is Memory.VRAM else "host", keep_at=request.ucx_log)
    try:
        with Cluster(request.prefill_tp, request.decode_tp, device=_device(request.memory),
                     capture=capture) as cluster:
            cluster.setup(plan, num_blocks)
            for prompt in request.prompt_tokens:
                for scheme in request.schemes:
                    for allocation in Allocation:
                        row = _measure(cluster, plan, request, prompt, scheme, allocation, num_blocks, on_step)
                        cluster.flush_stdout()
                        found = capture.transport()
                        rows.append(replace(row, transport=found.value if found else None))
    finally:
        capture.close()
    d = plan.decode
    return BenchResult(model=request.model.name, prefill_tp=request.prefill_tp, decode_tp=request.decode_tp,
                       memory=request.memory.value, backend=request.backend.value, block_size=d.block_size,
                       kernel_block_size=d.kernel_block_size, page_size_bytes=d.page_size_bytes,
                       num_tensors=d.num_tensors, rows=tuple(rows))


def _measure(cluster: Cluster, plan, request: BenchRequest, prompt: int, scheme: Scheme, allocation: Allocation,
             num_blocks: int, on_step: Callable[[str], None] | None) -> BenchRow:
    pools = BlockPool(num_blocks, seed=prompt), BlockPool(num_blocks, seed=prompt + 1)
    attention = next(i for i, g in enumerate(plan.decode.groups.groups) if g.kind.is_attention)
    samples, exact, predicted = [], True, []
    for k in range(request.num_requests):
        blocks = allocate(*pools, plan.decode, prompt, allocation)
        try:
            tag = f"{prompt}-{scheme.value}-{allocation.value}-{k}"
            moved = cluster.move(blocks, scheme, tag, timeout_s=request.timeout_s)
            exact &= all(c["is_exact"] for c in cluster.check(blocks, scheme))
        finally:  # the request's blocks go back on both sides, also on failure
            pools[0].give_back(blocks.prefill)
            pools[1].give_back(blocks.decode)
        samples.append(moved)
        predicted.append(transfer_cost(plan.prefill, plan.decode, prompt, scheme,
                                       num_runs=len(runs(blocks.pairs(attention))),
                                       served_runs=attention_runs(plan.decode, blocks.prefill, blocks.decode))
                         .served_descriptors)
        if on_step:
            on_step(tag)
    if not exact:
        raise CheckFailedError(f"{scheme.value} transfer of a {prompt}-token prompt ({allocation.value} blocks) "
                               "was not byte-exact")
    per_rank_bytes = samples[0][0]["num_bytes"]
    copy_s = cluster.copy_baseline(per_rank_bytes)

    def med(key: str) -> float:  # slowest decode rank per request, median over requests
        return statistics.median(max(r[key] for r in s) for s in samples)

    total = sum(r["num_bytes"] for r in samples[0])
    merged_all = [s[0]["num_merged"] for s in samples]  # the mean over requests, as vLLM's stats report it
    merged = None if None in merged_all else round(statistics.mean(merged_all))
    return BenchRow(prompt_tokens=prompt, scheme=scheme.value, allocation=allocation.value,
                    num_requests=request.num_requests, num_descriptors=samples[0][0]["num_descriptors"],
                    num_elements=samples[0][0]["num_elements"], num_merged=merged,
                    predicted_descriptors=round(statistics.mean(predicted)), num_bytes=total,
                    prepare_ms=1e3 * med("prepare_s"), post_ms=1e3 * med("post_s"),
                    transfer_ms=1e3 * med("transfer_s"), gbps=total / med("transfer_s") / 1e9,
                    copy_gbps=per_rank_bytes / copy_s / 1e9, is_exact=exact)


def require_memory(memory: Memory) -> None:
    """VRAM regions need a CUDA GPU that torch can see; refuse before any rank process starts."""
    import torch

    if memory is Memory.VRAM and not torch.cuda.is_available():
        raise CouldNotRunError("--memory vram needs CUDA: torch sees no CUDA GPU on this machine; "
                               "accepted here: --memory dram")


def _device(memory: Memory) -> str:
    return "cuda" if memory is Memory.VRAM else "cpu"
