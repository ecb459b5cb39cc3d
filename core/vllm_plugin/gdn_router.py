"""Per-batch GDN prefill routing inside a vLLM server, from a tuned profile (`launch --tuned-profile`).

For each prefill call the router finds the profile's nearest bucket (same per-rank heads, i.e. the TP; then
batch size and mean length, from host-side counts: no device sync) and returns a `Route`: the bucket's fastest
setting that can run here (the winner, else the next along the bucket's ranked list, e.g. FlashInfer's best where
FlashQLA is not installed), or vLLM's own call when that setting is what vLLM runs anyway or none can run.
Each bucket's decision is logged once
(`hybridserve: GDN prefill bucket ...`); with `HYBRIDSERVE_GDN_DISPATCH_LOG_CALLS=1` every call is logged too.

The kernels package is imported here lazily, inside the server (core never imports it at module level).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hybridserve.core.common.contracts import GDN_ROUTER_LOG_PREFIX as LOG_PREFIX
from hybridserve.core.common.errors import InputError
from hybridserve.core.vllm_plugin.log import logger

IsNative = Callable[[Any, tuple, Any], bool]
NATIVE = "vLLM's own kernel"


@dataclass(frozen=True, kw_only=True)
class Route:
    bucket: str  # "TP2 1x8192"
    label: str  # what runs: a setting label, or NATIVE
    backend: Any = None  # a kernels Backend; None: call vLLM's own kernel
    knobs: tuple = ()

    @property
    def is_native(self) -> bool:
        return self.backend is None


class GdnRouter:
    def __init__(self, profile_path: str, *, is_log_calls: bool = False) -> None:
        from hybridserve.kernels.dispatch import Dispatch  # lazy: kernels only where a tuned profile routes

        self.dispatch = Dispatch.from_file(profile_path)
        self.is_log_calls = is_log_calls
        self._routes: dict[tuple, Route] = {}

    def route(self, *, q: Any, v: Any, num_seqs: int, is_native: IsNative) -> Route:
        """q [.., T, Hk, dk], v [.., T, Hv, dv] (one varlen batch); `is_native(backend, knobs, shape)`: does
        vLLM's own call run exactly this setting here?"""
        hk, hv, num_tokens = q.shape[-2], v.shape[-2], q.shape[-3]
        try:
            entry = self.dispatch.nearest_bucket(num_key_heads=hk, num_value_heads=hv, num_seqs=num_seqs,
                                                 num_tokens=num_tokens)
        except InputError as exc:
            entry, key = None, ("heads", hk, hv)
            reason = str(exc)
        else:
            key = (id(entry), q.dtype, q.device.type)
        if key not in self._routes:
            self._routes[key] = (self._decide(entry, q, v, is_native) if entry is not None else
                                 Route(bucket=f"heads {hk}/{hv}", label=f"{NATIVE} ({reason})"))
            route = self._routes[key]
            logger.info("%s bucket %s (heads %d/%d) -> %s", LOG_PREFIX, route.bucket, hk, hv, route.label)
        route = self._routes[key]
        if self.is_log_calls:
            logger.info("%s call %d seq(s) %d token(s) -> bucket %s: %s", LOG_PREFIX, num_seqs, num_tokens,
                        route.bucket, route.label)
        return route

    def _decide(self, entry: Any, q: Any, v: Any, is_native: IsNative) -> Route:
        """The bucket's fastest setting that runs here, along its ranked list (as Dispatch.choose); vLLM's own
        call where that setting is what vLLM runs anyway or where none of them can run."""
        from hybridserve.kernels import registry  # lazy: the backends import torch and their kernels
        from hybridserve.kernels.inputs import GdnShape

        bucket = f"TP{entry.tp} {entry.num_seqs}x{entry.seq_len}"
        shape = GdnShape(seqlens=(entry.seq_len,) * entry.num_seqs, num_key_heads=q.shape[-2],
                         num_value_heads=v.shape[-2], key_head_dim=q.shape[-1], value_head_dim=v.shape[-1])
        passed_over: list[str] = []
        for choice in entry.ranked or (entry.winner,):
            if choice.backend not in registry.backend_names():
                passed_over.append(f"{choice.label} unknown to this hybridserve")
                continue
            backend = registry.get_backend(choice.backend)
            why = f" ({'; '.join(passed_over)})" if passed_over else ""
            if is_native(backend, choice.knobs, shape):
                return Route(bucket=bucket, label=f"{choice.label} = {NATIVE}{why}")
            ok, reason = backend.supports(shape, q.dtype, q.device)
            if ok:
                return Route(bucket=bucket, label=f"{choice.label}{why}", backend=backend, knobs=choice.knobs)
            passed_over.append(f"{choice.label} cannot run here: {reason}")
        return Route(bucket=bucket, label=f"{NATIVE} (no setting of the bucket runs here: {'; '.join(passed_over)})")


def l2_normalized(x: Any, eps: float) -> Any:
    """x / sqrt(sum(x^2) + eps) over the head dim, in float32 (as the kernels' in-kernel l2norm)."""
    import torch

    x32 = x.float()
    return x32 * torch.rsqrt(x32.pow(2).sum(-1, keepdim=True) + eps)
