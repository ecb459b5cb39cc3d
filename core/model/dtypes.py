"""Data types, parsed from strings once at the edge; below it nothing compares dtype strings."""

from __future__ import annotations

import enum

from hybridserve.core.common.errors import InputError


class DType(enum.Enum):
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"
    FLOAT32 = "float32"
    FP8_E4M3 = "fp8_e4m3"
    FP8_E5M2 = "fp8_e5m2"

    @property
    def num_bytes(self) -> int:
        return _BYTES[self]

    @classmethod
    def parse(cls, text: str, *, what: str) -> DType:
        """Read a dtype as HF configs and vLLM flags spell it ('bf16', 'bfloat16', 'fp8', 'float')."""
        key = str(text).strip().lower().removeprefix("torch.")
        if key in _ALIASES:
            return _ALIASES[key]
        accepted = ", ".join(sorted(_ALIASES))
        raise InputError(f"{what}: unknown dtype {text!r}; accepted: {accepted}")


_BYTES = {
    DType.BFLOAT16: 2,
    DType.FLOAT16: 2,
    DType.FLOAT32: 4,
    DType.FP8_E4M3: 1,
    DType.FP8_E5M2: 1,
}

_ALIASES = {
    "bfloat16": DType.BFLOAT16, "bf16": DType.BFLOAT16,
    "float16": DType.FLOAT16, "fp16": DType.FLOAT16, "half": DType.FLOAT16,
    "float32": DType.FLOAT32, "fp32": DType.FLOAT32, "float": DType.FLOAT32,
    "fp8": DType.FP8_E4M3, "fp8_e4m3": DType.FP8_E4M3, "fp8_e5m2": DType.FP8_E5M2,
}


def parse_optional(text: str | None, *, what: str) -> DType | None:
    """'auto' and None mean 'let the model decide' and become None."""
    if text is None or str(text).strip().lower() == "auto":
        return None
    return DType.parse(text, what=what)
