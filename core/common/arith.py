"""Integer arithmetic that the layout, descriptor and kernel-grid formulas share."""

from __future__ import annotations


def cdiv(numerator: int, denominator: int) -> int:
    """Ceiling division of integers (vLLM `cdiv`): the number of size-`denominator` pieces covering `numerator`."""
    return -(-numerator // denominator)


def round_up(value: int, multiple: int) -> int:
    """The smallest multiple of `multiple` that is >= `value` (vLLM `round_up`)."""
    return cdiv(value, multiple) * multiple
