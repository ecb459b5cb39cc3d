"""The `flashinfer` backend: `flashinfer.gdn_prefill.chunk_gated_delta_rule` (CuTe DSL on sm90, sm100, sm120).

Conversions at this edge only: FlashInfer's gate is linear (alpha = exp(g); log-space input gives NaN), its state
is [N, Hv, V, K] (the transpose of ours), cu_seqlens is required, head size must be 128. A missing initial state
is passed as zeros, as vLLM's adapter does, so one compiled specialization serves both cases.
Knobs: use_cp in {auto, False, True} (context parallelism across a sequence's chunks) and, with CP, the CP chunk
length (a multiple of 512 here; FlashInfer's granularity). FlashInfer 0.6 (vLLM 0.26's pin) has no CP chunk length
and no `max_seqlen`: those are passed only where the installed version takes them.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from typing import Any

import torch

from hybridserve.kernels.backend import OK, Backend, Capabilities, KnobSetting, Support, TensorMemo
from hybridserve.kernels.inputs import GdnShape

CP_CHUNK_LENGTHS = (512, 1024, 2048, 4096)


@functools.cache
def _load() -> Any:
    return importlib.import_module("flashinfer.gdn_prefill")


@functools.cache
def _accepts(name: str) -> bool:
    """Does the installed `chunk_gated_delta_rule` take this keyword? (False where FlashInfer does not import.)"""
    try:
        return name in inspect.signature(_load().chunk_gated_delta_rule).parameters
    except Exception:  # noqa: BLE001 (not importable here: availability() says why)
        return False


@functools.cache
def _sm90_and_sms(device: torch.device) -> tuple[bool, int]:
    props = torch.cuda.get_device_properties(device)
    return props.major == 9, props.multi_processor_count


def _cp_heuristic(num_seqs: int, num_heads: int, device: torch.device) -> bool:
    if device.type != "cuda":
        return False
    is_sm90, sms = _sm90_and_sms(device)
    return is_sm90 and num_seqs * num_heads < max(1, sms // 2)


class FlashInferBackend(Backend):
    name = "flashinfer"
    vllm_setting = "flashinfer"
    capabilities = Capabilities(
        devices=frozenset({"cuda"}),
        dtypes=frozenset({torch.bfloat16, torch.float16}),
        head_dims=frozenset({128}),
        min_compute_capability=(9, 0),
        requires_equal_head_dims=True,
    )

    def availability(self) -> Support:
        try:
            _load()
        except Exception as exc:
            return Support(is_ok=False, reason=f"flashinfer.gdn_prefill not importable ({type(exc).__name__}: "
                                               f"{exc})"[:160])
        if not torch.cuda.is_available():
            return Support(is_ok=False, reason="needs a CUDA GPU")
        return OK

    def knob_space(self, shape: GdnShape) -> list[KnobSetting]:
        settings: list[KnobSetting] = [(("use_cp", "auto"),), (("use_cp", False),), (("use_cp", True),)]
        longest = max(shape.seqlens, default=0)
        if _accepts("_cp_chunk_len"):
            settings += [(("use_cp", True), ("cp_chunk_len", n)) for n in CP_CHUNK_LENGTHS if n < longest]
        return settings

    def __init__(self) -> None:
        self._has_empty_memo = TensorMemo()

    def kernel_for(self, knobs: KnobSetting, *, num_seqs: int, num_value_heads: int,
                   device: torch.device) -> KnobSetting:
        """`use_cp="auto"` as FlashInfer 0.6 resolves it in `gdn_prefill.chunk_gated_delta_rule`: the context-parallel
        kernel on SM90 when num_seqs x heads < half the GPU's SMs (at least 1), else the plain one."""
        settings = dict(knobs)
        if settings.get("use_cp", "auto") == "auto":
            settings["use_cp"] = _cp_heuristic(num_seqs, num_value_heads, device)
        return tuple(sorted(settings.items()))

    def _has_empty(self, cu_seqlens: torch.Tensor) -> bool:
        """Whether a sequence is empty; read from the GPU once per cu_seqlens object (fla caches the same way)."""
        return self._has_empty_memo.get(cu_seqlens, lambda cu: bool((cu[1:] == cu[:-1]).any()))

    def prefill(self, q, k, v, g, beta, cu_seqlens, scale=None, initial_state=None, output_final_state=True,
                max_seqlen=None, **knobs: Any):
        num_seqs, num_value_heads = cu_seqlens.shape[0] - 1, v.shape[1]
        if initial_state is None:
            state = torch.zeros(num_seqs, num_value_heads, v.shape[2], k.shape[2], dtype=torch.float32,
                                device=q.device)
        else:
            state = initial_state.transpose(-1, -2).contiguous()
        # FlashInfer leaves the final state of an empty sequence unwritten: prefill it with the initial state then.
        output_state = state.clone() if self._has_empty(cu_seqlens) else None
        extra = {"max_seqlen": max_seqlen} if _accepts("max_seqlen") else {}
        if "cp_chunk_len" in knobs:
            extra["_cp_chunk_len"] = knobs["cp_chunk_len"]
        o, final = _load().chunk_gated_delta_rule(
            q.contiguous(), k.contiguous(), v.contiguous(), g=torch.exp(g.float()), beta=beta.float(),
            scale=scale, initial_state=state, output_final_state=True, cu_seqlens=cu_seqlens,
            output_state=output_state, use_cp=knobs.get("use_cp", "auto"), **extra,
        )
        return o, (final.transpose(-1, -2) if output_final_state else None)
