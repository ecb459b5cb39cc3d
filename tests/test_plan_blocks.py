"""P and D must get the same logical block: when they do not, plan suggests only a --block-size it confirmed."""

from __future__ import annotations

import re
from dataclasses import replace
from types import SimpleNamespace

import pytest

from hybridserve.core.common.errors import InputError
from hybridserve.core.layout import plan as plan_module
from hybridserve.core.layout.attention_backend import AttentionBackend
from hybridserve.core.layout.plan import PlanRequest, make_plan
from hybridserve.core.layout.rank_layout import LayoutRequest
from hybridserve.core.model.profiles import load_model, model_profile_names


def _suggestions():
    """Every shipped profile and backend, prefill TP 1/2 against decode TP 2/4/8: the refusals plan gives."""
    for name in model_profile_names():
        spec = load_model(name)
        for backend in AttentionBackend:
            for block_size in (None, 128):
                for tp, decode_tp in ((1, 2), (1, 4), (2, 8)):
                    layout = LayoutRequest(model=spec, tp=tp, backend=backend, block_size=block_size)
                    try:
                        make_plan(PlanRequest(layout=layout, decode_tp=decode_tp, prompt_tokens=(1024,)))
                    except InputError as exc:
                        if m := re.search(r"accepted: --block-size (\d+)$", str(exc)):
                            yield layout, decode_tp, int(m.group(1))


def test_every_suggested_block_size_gives_equal_blocks_on_both_sides():
    cases = list(_suggestions())
    assert any(lay.model.name == "qwen3.5-0.8b" and d == 4 and n == 640 for lay, d, n in cases)  # DESIGN.md's
    for layout, decode_tp, size in cases:
        request = PlanRequest(layout=replace(layout, block_size=size), decode_tp=decode_tp, prompt_tokens=(1024,))
        plan = make_plan(request)
        assert plan.prefill.block_size == plan.decode.block_size, (layout.model.name, layout.backend, size)


def _fake_layouts(monkeypatch, block_of):
    def fake_plan_layout(request):
        return SimpleNamespace(request=request, block_size=block_of(request))

    monkeypatch.setattr(plan_module, "plan_layout", fake_plan_layout)
    return LayoutRequest(model=load_model("qwen3.5-0.8b"), tp=1)


def test_no_size_is_suggested_when_none_makes_the_sides_agree(monkeypatch):
    layout = _fake_layouts(monkeypatch, lambda r: (r.block_size or 16) * r.tp)  # decode's block is always 2x
    with pytest.raises(InputError) as exc:
        make_plan(PlanRequest(layout=layout, decode_tp=2))
    assert "--block-size 512" not in str(exc.value)  # the old loop fell out of range and suggested its last value
    assert str(exc.value).endswith("no --block-size from 32 to 512 gives both the same: accepted: --decode-tp 1")


def test_sizes_a_side_refuses_are_skipped_not_raised(monkeypatch):
    def block_of(r):
        if r.tp == 2 and r.block_size is not None and r.block_size % 64:
            raise InputError(f"--block-size {r.block_size}: accepted: multiples of 64")
        return max(r.block_size or 16, 48) if r.tp == 1 else (r.block_size or 16)

    layout = _fake_layouts(monkeypatch, block_of)
    with pytest.raises(InputError, match=r"gets 48-token blocks, decode TP2 gets 16; .*accepted: --block-size 64$"):
        make_plan(PlanRequest(layout=layout, decode_tp=2))
