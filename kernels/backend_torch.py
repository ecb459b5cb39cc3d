"""The `torch` backend: the chunked torch implementation (CPU and GPU), the fallback for every consumer."""

from __future__ import annotations

from typing import Any

import torch

from hybridserve.kernels import chunk_torch
from hybridserve.kernels.backend import OK, Backend, Capabilities, KnobSetting, Support
from hybridserve.kernels.inputs import GdnShape


class TorchBackend(Backend):
    name = "torch"
    capabilities = Capabilities(
        devices=frozenset({"cpu", "cuda"}),
        dtypes=frozenset({torch.bfloat16, torch.float16, torch.float32}),
    )

    def availability(self) -> Support:
        return OK

    def knob_space(self, shape: GdnShape) -> list[KnobSetting]:
        return [(("chunk_size", 64),), (("chunk_size", 128),)]

    def prefill(self, q, k, v, g, beta, cu_seqlens, scale=None, initial_state=None, output_final_state=True,
                max_seqlen=None, **knobs: Any):
        return chunk_torch.gdn_prefill(q, k, v, g, beta, cu_seqlens, scale, initial_state, output_final_state,
                                       chunk_size=int(knobs.get("chunk_size", 64)))
