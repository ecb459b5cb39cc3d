"""The backends verify and tune know about, by name. Tests may register more (a deliberately wrong one)."""

from __future__ import annotations

from hybridserve.core.common.errors import InputError
from hybridserve.kernels.backend import Backend
from hybridserve.kernels.backend_fla import FlaBackend
from hybridserve.kernels.backend_flashinfer import FlashInferBackend
from hybridserve.kernels.backend_flashqla import FlashQlaBackend
from hybridserve.kernels.backend_torch import TorchBackend
from hybridserve.kernels.backend_vllm_cpu import VllmCpuBackend

_BACKENDS: dict[str, Backend] = {b.name: b for b in (TorchBackend(), VllmCpuBackend(), FlaBackend(),
                                                      FlashInferBackend(), FlashQlaBackend())}


def register(backend: Backend) -> None:
    _BACKENDS[backend.name] = backend


def unregister(name: str) -> None:
    _BACKENDS.pop(name, None)


def backend_names() -> list[str]:
    return list(_BACKENDS)


def get_backend(name: str) -> Backend:
    try:
        return _BACKENDS[name]
    except KeyError:
        raise InputError(f"--backend {name}: unknown backend; accepted: {', '.join(_BACKENDS)}") from None


def select(names: list[str] | None) -> list[Backend]:
    """The named backends (all registered ones when `names` is empty or None), in registry order."""
    if not names:
        return list(_BACKENDS.values())
    return [get_backend(n) for n in names]
