"""The `flashinfer` backend: `flashinfer.gdn_prefill.chunk_gated_delta_rule` (CuTe DSL on sm90, sm100, sm120).

Conversions at this edge only: FlashInfer's gate is linear (alpha = exp(g); log-space input gives NaN), its state
is [N, Hv, V, K] (the transpose of ours), cu_seqlens is required, head size must be 128. A missing initial state
is passed as zeros, as vLLM's adapter does, so one compiled specialization serves both cases. Empty sequences are
left out of the call (its CP kernel writes a wrong final state for them: empty_sequences.py).
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

from hybridserve.kernels import empty_sequences
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
        self._prepared_memo = TensorMemo()

    def kernel_for(self, knobs: KnobSetting, *, num_seqs: int, num_value_heads: int,
                   device: torch.device) -> KnobSetting:
        """`use_cp="auto"` as FlashInfer 0.6 resolves it in `gdn_prefill.chunk_gated_delta_rule`: the context-parallel
        kernel on SM90 when num_seqs x heads < half the GPU's SMs (at least 1), else the plain one."""
        settings = dict(knobs)
        if settings.get("use_cp", "auto") == "auto":
            settings["use_cp"] = _cp_heuristic(num_seqs, num_value_heads, device)
        return tuple(sorted(settings.items()))

    def _prepared(self, cu_seqlens: torch.Tensor) -> empty_sequences.NonEmpty:
        """cu_seqlens without its empty sequences, worked out once per tensor object (one device read)."""
        return self._prepared_memo.get(cu_seqlens, empty_sequences.drop_empty)

    def prefill(self, q, k, v, g, beta, cu_seqlens, scale=None, initial_state=None, output_final_state=True,
                max_seqlen=None, **knobs: Any):
        batch = self._prepared(cu_seqlens)
        if batch.is_all_empty:  # no token: the states unchanged
            final = empty_sequences.unchanged_states(batch, initial_state, (v.shape[1], k.shape[2], v.shape[2]),
                                                     v.device)
            return v.new_zeros(v.shape), final if output_final_state else None
        kept = empty_sequences.kept_rows(batch, initial_state)
        if kept is None:
            state = torch.zeros(batch.cu_seqlens.numel() - 1, v.shape[1], v.shape[2], k.shape[2],
                                dtype=torch.float32, device=q.device)
        else:
            state = kept.transpose(-1, -2).contiguous()
        extra = {"max_seqlen": max_seqlen} if _accepts("max_seqlen") else {}
        if "cp_chunk_len" in knobs:
            extra["_cp_chunk_len"] = knobs["cp_chunk_len"]
        o, final = _load().chunk_gated_delta_rule(
            q.contiguous(), k.contiguous(), v.contiguous(), g=torch.exp(g.float()), beta=beta.float(),
            scale=scale, initial_state=state, output_final_state=True, cu_seqlens=batch.cu_seqlens,
            use_cp=knobs.get("use_cp", "auto"), **extra,
        )
        if not output_final_state:
            return o, None
        return o, empty_sequences.restore_rows(batch, final.transpose(-1, -2), initial_state)
