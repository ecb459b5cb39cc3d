"""The verify case matrix: the shapes that break GDN kernels, plus a model's own heads at each TP."""

from __future__ import annotations

from dataclasses import dataclass

from hybridserve.core.common.errors import InputError
from hybridserve.core.model.spec import ModelSpec
from hybridserve.kernels.inputs import GdnShape

# Lengths that are not multiples of the 64-token chunk, an empty sequence inside a batch, a ragged batch.
ZERO_LEN_INSIDE = (40, 0, 129, 0, 3)
VARLEN = (31, 63, 93, 123, 150, 500)
MODEL_SEQLENS = (300, 0, 129)


@dataclass(frozen=True, kw_only=True)
class VerifyCase:
    case_id: str
    shape: GdnShape
    has_initial_state: bool


def model_heads(model: ModelSpec, tp: int) -> tuple[int, int]:
    """(key heads, value heads) per rank: vLLM splits both by TP (Hk/TP, Hv/TP)."""
    if model.gdn is None:
        raise InputError(f"--model {model.name}: has no GDN (linear attention) layers; pick a Qwen3.5/Qwen3-Next model")
    gdn = model.gdn
    if tp < 1:
        raise InputError(f"--tp {tp}: accepted: 1 or more, dividing {model.name}'s {gdn.num_key_heads} key heads")
    if gdn.num_key_heads % tp or gdn.num_value_heads % tp:
        raise InputError(f"--tp {tp}: does not divide {model.name}'s {gdn.num_key_heads} key / "
                         f"{gdn.num_value_heads} value heads; accepted: divisors of {gdn.num_key_heads}")
    return gdn.num_key_heads // tp, gdn.num_value_heads // tp


def case_matrix(
    *, head_dim: int = 128, long_len: int = 1000, model: ModelSpec | None = None, tps: tuple[int, ...] = (),
    model_seqlens: tuple[int, ...] = MODEL_SEQLENS,
) -> list[VerifyCase]:
    for flag, value in (("--head-dim", head_dim), ("--long-len", long_len)):
        if value < 1:  # a head of size 0 divides by zero in every kernel; a case of length 0 is already in the matrix
            raise InputError(f"{flag} {value}: accepted: 1 or more")

    def case(case_id: str, seqlens: tuple[int, ...], hk: int = 2, hv: int = 4, init: bool = False,
             dk: int = head_dim, dv: int = head_dim) -> VerifyCase:
        shape = GdnShape(seqlens=seqlens, num_key_heads=hk, num_value_heads=hv, key_head_dim=dk, value_head_dim=dv)
        return VerifyCase(case_id=case_id, shape=shape, has_initial_state=init)

    cases = [case(f"len{n}", (n,)) for n in (1, 63, 65, long_len)]
    cases += [
        case("zero-len-inside", ZERO_LEN_INSIDE, init=True),
        case("varlen", VARLEN),
        case("init-state", (65, 130), init=True),
    ]
    cases += [case(f"gva{r}", (65, 100), hk=2, hv=2 * r, init=True) for r in (1, 2, 3, 4)]
    if model is not None and model.gdn is not None:
        for tp in tps:
            hk, hv = model_heads(model, tp)
            cases.append(case(f"{model.name}-tp{tp}", model_seqlens, hk=hk, hv=hv, init=True,
                              dk=model.gdn.key_head_dim, dv=model.gdn.value_head_dim))
    return cases
