"""The GPUs of this host, counted without torch: NVML through ctypes (the driver's own library, no Python package
needed), then `nvidia-smi -L`; a host without either has 0 GPUs."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from collections.abc import Callable


def count_gpus(*, nvml: Callable[[], int | None] | None = None, smi: Callable[[], int | None] | None = None) -> int:
    """GPUs the driver sees: NVML first, then `nvidia-smi -L`, else 0 (a CPU host)."""
    for probe in (nvml or _count_nvml, smi or _count_smi):
        found = probe()
        if found is not None:
            return found
    return 0


def _count_nvml() -> int | None:
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    count = ctypes.c_uint(0)
    try:
        if lib.nvmlInit_v2() != 0:
            return None
        ok = lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 0
        lib.nvmlShutdown()
    except AttributeError:
        return None
    return count.value if ok else None


def _count_smi() -> int | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_smi_list(done.stdout) if done.returncode == 0 else None


def parse_smi_list(text: str) -> int:
    """`nvidia-smi -L` prints one 'GPU <n>: <name> (UUID: ...)' line per GPU (MIG devices are indented)."""
    return sum(1 for line in text.splitlines() if line.startswith("GPU "))
