"""Numbers from the command line that feed arithmetic: refused in one line when they cannot mean anything."""

from __future__ import annotations

import math

from hybridserve.core.common.errors import InputError


def gib_to_bytes(value: float, flag: str) -> int:
    """GiB -> bytes; NaN, infinities and negative sizes are refused (int() of them would raise or mislead)."""
    if not math.isfinite(value) or value < 0:
        raise InputError(f"{flag} {value}: accepted: a finite size in GiB, 0 or more")
    return int(value * 2**30)
