"""Per-batch GDN prefill routing inside a vLLM server, from a tuned profile (`launch --tuned-profile`).

For each prefill call the router finds the profile's nearest bucket (same per-rank heads, i.e. the TP; then
batch size and mean length, from host-side counts: no device sync) and returns a `Route`: the bucket's winner, or
vLLM's own call when the winner is what vLLM runs anyway or cannot run here. Each bucket's decision is logged once
(`hybridserve: GDN prefill bucket ...`); with `HYBRIDSERVE_GDN_DISPATCH_LOG_CALLS=1` every call is logged too.

The kernels package is imported here lazily, inside the server (core never imports it at module level).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hybridserve.core.vllm_plugin.log import logger

LOG_PREFIX = "hybridserve: GDN prefill"
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
        from hybridserve.kernels.dispatch import Dispatch

        self.dispatch = Dispatch.from_file(profile_path)
        self.is_log_calls = is_log_calls
        self._routes: dict[tuple, Route] = {}

    def route(self, *, q: Any, v: Any, num_seqs: int, is_native: IsNative) -> Route:
        """q [.., T, Hk, dk], v [.., T, Hv, dv] (one varlen batch); `is_native(backend, knobs, shape)`: does
        vLLM's own call run exactly this setting here?"""
        from hybridserve.core.common.errors import InputError

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
        from hybridserve.kernels import registry
        from hybridserve.kernels.inputs import GdnShape

        bucket = f"TP{entry.tp} {entry.num_seqs}x{entry.seq_len}"
        winner = entry.winner
        if winner.backend not in registry.backend_names():
            return Route(bucket=bucket, label=f"{NATIVE} (winner {winner.label} unknown to this hybridserve)")
        backend = registry.get_backend(winner.backend)
        shape = GdnShape(seqlens=(entry.seq_len,) * entry.num_seqs, num_key_heads=q.shape[-2],
                         num_value_heads=v.shape[-2], key_head_dim=q.shape[-1], value_head_dim=v.shape[-1])
        if is_native(backend, winner.knobs, shape):
            return Route(bucket=bucket, label=f"{winner.label} = {NATIVE}")
        ok, reason = backend.supports(shape, q.dtype, q.device)
        if not ok:
            return Route(bucket=bucket, label=f"{NATIVE} (winner {winner.label} cannot run here: {reason})")
        return Route(bucket=bucket, label=winner.label, backend=backend, knobs=winner.knobs)


def l2_normalized(x: Any, eps: float) -> Any:
    """x / sqrt(sum(x^2) + eps) over the head dim, in float32 (as the kernels' in-kernel l2norm)."""
    import torch

    x32 = x.float()
    return x32 * torch.rsqrt(x32.pow(2).sum(-1, keepdim=True) + eps)
