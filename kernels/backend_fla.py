"""The `fla` backend: fla-core's Triton `chunk_gated_delta_rule` (the kernels vLLM vendors as its `triton` path).

fla takes the same log-space gate and [N, Hv, K, V] state as the project; it wants a leading batch dim of 1 for
varlen. FLA_DISABLE_BACKEND_DISPATCH=1 keeps fla on its own Triton path (with `flash_qla` installed it would
silently run FlashQLA instead).
"""

from __future__ import annotations

import functools
import importlib
import os
from typing import Any

import torch

from hybridserve.kernels.backend import OK, Backend, Capabilities, Support


@functools.cache
def _load() -> Any:
    os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")
    os.environ.setdefault("FLA_FLASH_QLA", "0")
    return importlib.import_module("fla.ops.gated_delta_rule")


class FlaBackend(Backend):
    name = "fla"
    vllm_setting = "triton"
    capabilities = Capabilities(
        devices=frozenset({"cuda"}),
        dtypes=frozenset({torch.bfloat16, torch.float16, torch.float32}),
        head_dims=frozenset({16, 32, 64, 128, 256}),
        min_compute_capability=(8, 0),
    )

    def availability(self) -> Support:
        try:
            _load()
        except Exception as exc:  # ImportError, or a broken triton install
            return Support(is_ok=False, reason=f"fla-core not importable ({type(exc).__name__}: {exc})"[:160])
        if not torch.cuda.is_available():
            return Support(is_ok=False, reason="needs a CUDA GPU")
        return OK

    def prefill(self, q, k, v, g, beta, cu_seqlens, scale=None, initial_state=None, output_final_state=True,
                max_seqlen=None, **knobs: Any):
        o, state = _load().chunk_gated_delta_rule(
            q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), g.unsqueeze(0), beta.unsqueeze(0),
            scale=scale, initial_state=initial_state, output_final_state=output_final_state,
            cu_seqlens=cu_seqlens, **knobs,  # as given: fla caches chunk indices per cu_seqlens object
        )
        return o.squeeze(0), state
