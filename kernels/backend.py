"""One interface for every GDN prefill backend: prefill in the project's convention, capabilities, knob space.

An adapter converts layouts only inside its own `prefill` (FlashInfer's linear gate and [N, Hv, V, K] state never
leak out). `availability()` says whether the package and the hardware are here; `supports(shape, dtype, device)`
says whether one call would work, so verify and tune print the reason instead of crashing.
"""

from __future__ import annotations

import abc
import collections
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from hybridserve.kernels.inputs import GdnShape

# A knob setting is a tuple of (name, value) pairs, hashable and printable; () is the backend's default.
KnobSetting = tuple[tuple[str, Any], ...]


def knob_label(knobs: KnobSetting) -> str:
    return ",".join(f"{k}={v}" for k, v in knobs) or "default"


@dataclass(frozen=True, kw_only=True)
class Capabilities:
    devices: frozenset[str]  # torch device types: "cpu", "cuda"
    dtypes: frozenset[torch.dtype]
    head_dims: frozenset[int] | None = None  # None: any head size
    min_compute_capability: tuple[int, int] | None = None  # CUDA only
    requires_equal_head_dims: bool = False


@dataclass(frozen=True, kw_only=True)
class Support:
    is_ok: bool
    reason: str = ""

    def __iter__(self):  # allows `ok, reason = backend.supports(...)`
        return iter((self.is_ok, self.reason))


OK = Support(is_ok=True)


class TensorMemo:
    """A value worked out once per tensor object, e.g. from a batch's cu_seqlens, which vLLM passes to every layer
    of a step: keyed by identity (no device read to compare), the last `size` tensors kept."""

    def __init__(self, size: int = 8) -> None:
        self._items: collections.deque = collections.deque(maxlen=size)

    def get(self, tensor: torch.Tensor, compute: Callable[[torch.Tensor], Any]) -> Any:
        for seen, value in self._items:
            if seen is tensor:
                return value
        value = compute(tensor)
        self._items.append((tensor, value))
        return value


class Backend(abc.ABC):
    """Subclasses set `name`, `capabilities` and `vllm_setting` (the vLLM `gdn_prefill_backend` value that runs
    this backend's kernel, None when vLLM has none)."""

    name: str
    capabilities: Capabilities
    vllm_setting: str | None = None

    @abc.abstractmethod
    def availability(self) -> Support:
        """Is the package importable and the hardware present? Cheap after the first call."""

    def knob_space(self, shape: GdnShape) -> list[KnobSetting]:
        """Every knob setting worth timing for this shape; the first one is the backend's own default."""
        return [()]

    def kernel_for(self, knobs: KnobSetting, *, num_seqs: int, num_value_heads: int,
                   device: torch.device) -> KnobSetting:
        """The setting with every 'auto' knob resolved as the library resolves it for this batch: two settings
        with the same answer run the same kernel (a router then keeps vLLM's own call). Default: as given."""
        return tuple(knobs)

    @abc.abstractmethod
    def prefill(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        cu_seqlens: torch.Tensor,
        scale: float | None = None,
        initial_state: torch.Tensor | None = None,
        output_final_state: bool = True,
        max_seqlen: int | None = None,
        **knobs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(o [T, Hv, dv] in q's dtype, final_state [N, Hv, dk, dv] float32 or None)."""

    def supports(self, shape: GdnShape, dtype: torch.dtype, device: torch.device) -> Support:
        available = self.availability()
        if not available.is_ok:
            return available
        return check_capabilities(self.capabilities, shape, dtype, device)


def check_capabilities(caps: Capabilities, shape: GdnShape, dtype: torch.dtype, device: torch.device) -> Support:
    if device.type not in caps.devices:
        return Support(is_ok=False, reason=f"runs on {'/'.join(sorted(caps.devices))}, not {device.type}")
    if dtype not in caps.dtypes:
        names = "/".join(sorted(str(d).removeprefix("torch.") for d in caps.dtypes))
        return Support(is_ok=False, reason=f"inputs {str(dtype).removeprefix('torch.')} not supported ({names})")
    dims = {shape.key_head_dim, shape.value_head_dim}
    if caps.head_dims is not None and not dims <= caps.head_dims:
        return Support(is_ok=False, reason=f"head size {sorted(dims)} not in {sorted(caps.head_dims)}")
    if caps.requires_equal_head_dims and len(dims) > 1:
        return Support(is_ok=False, reason="needs key head size == value head size")
    if shape.num_value_heads % shape.num_key_heads:
        return Support(is_ok=False, reason="value heads must be a multiple of key heads")
    if device.type == "cuda" and caps.min_compute_capability is not None:
        cc = torch.cuda.get_device_capability(device)
        if cc < caps.min_compute_capability:
            need = ".".join(map(str, caps.min_compute_capability))
            return Support(is_ok=False, reason=f"needs compute capability >= {need}, GPU has {cc[0]}.{cc[1]}")
    return OK
