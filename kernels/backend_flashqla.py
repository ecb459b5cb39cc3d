"""The `flashqla` backend: FlashQLA's `chunk_gated_delta_rule` (`flash-qla`, the Qwen team's TileLang kernels).

FlashQLA takes the project's convention (log-space gate, [N, Hv, K, V] state, GVA, varlen with a leading batch
of 1), so the adapter only adds and removes that batch dim. Its limits (fla 0.6's FlashQLA backend checks the
same): SM90 / SM100 / SM103 / SM120, bf16 or fp16 q/k/v, key and value head size 128. Knobs: `auto_cp` (its
intra-card context parallelism for long sequences, on by default) and, with it, `force_intra_cp` (always split).
The first call of each new shape class JIT-compiles (17-44 s per class measured on an H200).

It needs `tilelang`, which pins `apache-tvm-ffi<0.1.13` while FlashInfer 0.7 needs 0.1.15: one Python
environment rarely holds both. So tune FlashQLA in its own process (its own PYTHONPATH) and merge the profiles
(`hybridserve tune --merge`); a server that lacks it falls back (dispatch says so once).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from typing import Any

import torch

from hybridserve.kernels import empty_sequences
from hybridserve.kernels.backend import OK, Backend, Capabilities, KnobSetting, Support, TensorMemo
from hybridserve.kernels.inputs import GdnShape

CP_MIN_TOKENS = 4096  # below this one sequence has too few chunks for intra-card CP to matter: not swept


@functools.cache
def _load() -> Any:
    return importlib.import_module("flash_qla")


class FlashQlaBackend(Backend):
    name = "flashqla"
    capabilities = Capabilities(
        devices=frozenset({"cuda"}),
        dtypes=frozenset({torch.bfloat16, torch.float16}),
        head_dims=frozenset({128}),
        min_compute_capability=(9, 0),
        requires_equal_head_dims=True,
    )

    def __init__(self) -> None:
        self._prepared_memo = TensorMemo()

    def availability(self) -> Support:
        if importlib.util.find_spec("flash_qla") is None:
            return Support(is_ok=False, reason="flash-qla not installed (pip install flash-qla; needs tilelang, "
                                               "apache-tvm-ffi<0.1.13: use its own environment)")
        if not torch.cuda.is_available():
            return Support(is_ok=False, reason="needs a CUDA GPU")
        try:
            _load()  # picks its kernels by compute capability at import; raises on other GPUs
        except Exception as exc:
            return Support(is_ok=False, reason=f"flash_qla not importable ({type(exc).__name__}: {exc})"[:160])
        return OK

    def knob_space(self, shape: GdnShape) -> list[KnobSetting]:
        settings: list[KnobSetting] = [(("auto_cp", True),), (("auto_cp", False),)]
        if max(shape.seqlens, default=0) >= CP_MIN_TOKENS:
            settings.append((("auto_cp", True), ("force_intra_cp", True)))
        return settings

    def _prepared(self, cu_seqlens: torch.Tensor) -> empty_sequences.NonEmpty:
        """cu_seqlens as int64 without its empty sequences (FlashQLA refuses them: empty_sequences.py), worked out
        once per tensor object."""
        return self._prepared_memo.get(cu_seqlens, lambda cu: empty_sequences.drop_empty(cu.to(torch.int64)))

    def prefill(self, q, k, v, g, beta, cu_seqlens, scale=None, initial_state=None, output_final_state=True,
                max_seqlen=None, **knobs: Any):
        batch = self._prepared(cu_seqlens)
        if batch.is_all_empty:  # no token: the states unchanged
            final = empty_sequences.unchanged_states(batch, initial_state, (v.shape[1], k.shape[2], v.shape[2]),
                                                     v.device)
            return v.new_zeros(v.shape), final if output_final_state else None
        o, state = _load().chunk_gated_delta_rule(
            q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), g.unsqueeze(0), beta.unsqueeze(0),
            scale=scale, initial_state=empty_sequences.kept_rows(batch, initial_state),
            output_final_state=output_final_state, cu_seqlens=batch.cu_seqlens,
            auto_cp=bool(knobs.get("auto_cp", True)), force_intra_cp=bool(knobs.get("force_intra_cp", False)),
        )
        return o.squeeze(0), empty_sequences.restore_rows(batch, state, initial_state)
