"""Strings become enum members once, at the edge; a refusal names the input and lists what is accepted."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import TypeVar

from hybridserve.core.common.errors import InputError

E = TypeVar("E", bound=enum.Enum)


def parse_choice(enum_type: type[E], text: object, *, what: str, aliases: Mapping[str, str] | None = None) -> E:
    """The member whose value is `text` (case and surrounding space ignored, '-' read as '_').

    `what` names the input in the refusal, e.g. "--role" gives "--role foo: accepted: prefill, decode, ...".
    `aliases` maps other spellings to a member's value ("fa" -> "flash_attn").
    """
    key = str(text).strip().lower().replace("-", "_")
    key = (aliases or {}).get(key, key)
    for member in enum_type:
        if member.value == key:
            return member
    raise InputError(f"{what} {text}: accepted: {', '.join(str(m.value) for m in enum_type)}")
