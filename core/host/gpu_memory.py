"""A GPU's total memory, asked of the driver without torch: NVML through ctypes, then `nvidia-smi`; None off a GPU host.

Launch uses it to check, before anything starts, whether one request at the model's own context fits the KV cache
a role's share of the GPU leaves (context_fit.py).
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from collections.abc import Callable

MIB = 2**20


class _NvmlMemory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


def gpu_memory_bytes(gpu: int = 0, *, nvml: Callable[[int], int | None] | None = None,
                     smi: Callable[[int], int | None] | None = None) -> int | None:
    """Total memory of GPU `gpu` in bytes: NVML first, then `nvidia-smi`, else None (no driver, no such GPU)."""
    for probe in (nvml or _nvml_total, smi or _smi_total):
        found = probe(gpu)
        if found is not None:
            return found
    return None


def _nvml_total(gpu: int) -> int | None:
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    handle, memory = ctypes.c_void_p(), _NvmlMemory()
    try:
        if lib.nvmlInit_v2() != 0:
            return None
        ok = (lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(gpu), ctypes.byref(handle)) == 0
              and lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(memory)) == 0)
        lib.nvmlShutdown()
    except AttributeError:
        return None
    return int(memory.total) if ok else None


def _smi_query(gpu: int, field: str) -> str | None:
    """`nvidia-smi -i GPU --query-gpu=FIELD --format=csv,noheader,nounits`'s output; None without a driver or on error."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        done = subprocess.run(["nvidia-smi", "-i", str(gpu), f"--query-gpu={field}", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def _smi_total(gpu: int) -> int | None:
    text = _smi_query(gpu, "memory.total")
    return None if text is None else parse_smi_total(text)


def parse_smi_total(text: str) -> int | None:
    """`nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits` prints MiB, e.g. '143771'."""
    try:
        return int(text.strip().splitlines()[0]) * MIB
    except (IndexError, ValueError):
        return None


def gpu_name(gpu: int = 0) -> str | None:
    """GPU `gpu`'s name from `nvidia-smi` (e.g. 'NVIDIA H200'), or None off a GPU host."""
    lines = (_smi_query(gpu, "name") or "").strip().splitlines()
    return lines[0].strip() if lines else None
