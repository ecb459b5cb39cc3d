"""Shared builders for the transfer tests: plans for the acceptance shapes and an in-process mover."""

from __future__ import annotations

import ctypes

from hybridserve.core.layout.attention_backend import AttentionBackend
from hybridserve.core.model.dtypes import DType
from dataclasses import replace

from hybridserve.core.layout.rank_layout import LayoutRequest, plan_layout
from hybridserve.core.layout.plan import PlanRequest, make_plan
from hybridserve.core.model.profiles import load_model
from hybridserve.transfer.blocks import blocks_per_group

# (model, prefill TP, decode TP)
TP_CASES = [("qwen3.5-0.8b", 1, 1), ("qwen3.5-0.8b", 2, 1), ("qwen3.5-0.8b", 1, 2), ("qwen3.5-0.8b", 4, 2),
            ("qwen3.5-397b-a17b", 1, 1), ("qwen3.5-397b-a17b", 2, 1), ("qwen3.5-397b-a17b", 1, 2),
            ("qwen3.5-397b-a17b", 4, 2)]


def case_id(case) -> str:
    return f"{case[0].removeprefix('qwen3.5-')}-tp{case[1]}to{case[2]}"


def prompt_for(model: str) -> int:
    """Two or three logical blocks: a partial last block, several kernel blocks each."""
    return 1500 if "397b" in model else 1200


def plan_for(model: str, prefill_tp: int, decode_tp: int, *, spec: int = 0,
             backend: AttentionBackend = AttentionBackend.FLASHINFER, prompt: int = 1500):
    """The plan, with --block-size raised where prefill and decode TP would get different blocks (TP4)."""
    ssm = DType.BFLOAT16 if "397b" in model else None  # 397B as the blog recipe runs it; 0.8B fp32 default
    request = LayoutRequest(model=load_model(model), tp=prefill_tp, backend=backend, ssm_dtype=ssm,
                            num_speculative_tokens=spec)
    block = max(plan_layout(request).block_size, plan_layout(replace(request, tp=decode_tp)).block_size)
    request = replace(request, block_size=block)
    return make_plan(PlanRequest(layout=request, decode_tp=decode_tp, prompt_tokens=(prompt,)))


def pool_size(plan, prompt: int) -> int:
    """Null block + one request + a little room, so fragmented ids really scatter."""
    return 1 + sum(blocks_per_group(plan.decode, prompt)) + 3


def move_in_process(reads) -> None:
    """Apply descriptor lists with memmove inside one process (both sides' regions live here)."""
    for read in reads:
        local, remote = read.expanded()
        for (dst, length, _), (src, rlen, _) in zip(local.tolist(), remote.tolist(), strict=True):
            assert length == rlen
            ctypes.memmove(dst, src, length)



def nixl_merged(read, region_of) -> int:
    """What NIXL's make_prepped_xfer posts for one ReadDescriptors, emulated (ai-dynamo/nixl #1756): prep
    (`nixlMemSection::populate`) cuts each prepared list into runs of equal length, one region and one positive
    stride; posted indices that go up by one on both sides inside a run dense on both sides (stride == length, the
    same stride) merge."""
    def cut(rows):
        run_of, strides, prev = [], [], None
        for addr, length in rows:
            if prev is not None and length == prev[1] and region_of(addr) == region_of(prev[0]) and addr > prev[0] \
                    and strides[-1] in (None, addr - prev[0]):
                strides[-1] = addr - prev[0]
            else:
                strides.append(None)
            run_of.append(len(strides) - 1)
            prev = (addr, length)
        return run_of, strides

    local_list, remote_list = read.prepared if read.prepared is not None else read.expanded()
    (lrun, lstride), (rrun, rstride) = (cut([(int(r[0]), int(r[1])) for r in rows.tolist()])
                                        for rows in (local_list, remote_list))
    li, ri = (x.tolist() for x in read.indices())
    posted = 0
    for k in range(len(li)):
        a, b = li[k], ri[k]
        length = int(local_list[a][1])
        if k and a == li[k - 1] + 1 and b == ri[k - 1] + 1 and lrun[a] == lrun[a - 1] and rrun[b] == rrun[b - 1] \
                and lstride[lrun[a]] == length and rstride[rrun[b]] == length:
            continue
        posted += 1
    return posted
