"""The issue-7 fused Triton kernel against the float64 judge, on CPU through Triton's interpreter (TRITON_INTERPRET=1).

Tiny shapes (head size 32) keep the interpreter fast; the GPU run of benchmarks/kernels_fused.py verifies the
real shapes. bf16 operands are multiplied in float32 under the interpreter (it multiplies bf16 as raw bits).
"""

from __future__ import annotations

import importlib

import pytest
import torch

from hybridserve.core.dtypes import DType
from hybridserve.kernels import naive
from hybridserve.kernels.backend_fused import FusedTritonBackend, default_knobs
from hybridserve.kernels.cases import case_matrix
from hybridserve.kernels.inputs import GdnShape, make_inputs
from hybridserve.kernels.metrics import assert_close
from hybridserve.kernels.verify import Status, run_verify

TOL = 2e-2  # verify's bf16 tolerance
MODULES = ("hybridserve.kernels.fused_triton", "hybridserve.kernels.fused_triton_run",
           "hybridserve.kernels.fused_triton_cp")


@pytest.fixture(scope="module")
def run():
    """fused_triton_run with its kernels built for the interpreter (triton.jit reads TRITON_INTERPRET at import)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "1")
        triton = pytest.importorskip("triton")
        mods = [importlib.import_module(m) for m in MODULES]
        if not isinstance(mods[0].gdn_walk_kernel, triton.runtime.interpreter.InterpretedFunction):
            mods = [importlib.reload(m) for m in mods]
        yield mods[1]
    for m in MODULES:  # leave compiled-mode modules behind for anyone importing them later
        importlib.reload(importlib.import_module(m))


def _shape(seqlens, hk=1, hv=2, d=32) -> GdnShape:
    return GdnShape(seqlens=seqlens, num_key_heads=hk, num_value_heads=hv, key_head_dim=d, value_head_dim=d)


def _check(run, shape, knobs, init=True, seed=0, dtype=torch.bfloat16):
    x = make_inputs(shape, dtype=dtype, seed=seed, has_initial_state=init)
    o, state = run.gdn_prefill(**x.as_kwargs(), knobs=knobs)
    expected_o, expected_state = naive.gdn_prefill(**x.as_kwargs())
    assert o.dtype == dtype and state.dtype == torch.float32
    assert_close(o, expected_o, TOL, "o")
    assert_close(state, expected_state, TOL, "final state")


def test_verify_matrix_passes_through_the_interpreter(run) -> None:
    """The project's verify matrix: lengths 1/63/65/130, a zero-length sequence inside a batch, ragged varlen,
    an initial state, GVA 1-4."""
    cases = case_matrix(head_dim=32, long_len=130)
    report = run_verify([FusedTritonBackend()], cases, dtype=DType.BFLOAT16, device="cpu")
    assert {r.status for r in report.results} == {Status.PASS}, [r for r in report.results if r.status != Status.PASS]
    assert {r.case_id for r in report.results} >= {"len1", "len63", "len65", "len130", "zero-len-inside", "varlen",
                                                    "init-state", "gva1", "gva2", "gva3", "gva4"}


@pytest.mark.parametrize(("chunk_size", "block_v", "solve_block"), [(16, 16, 16), (32, 16, 8), (64, 32, 16)])
def test_knobs_do_not_change_the_result(run, chunk_size, block_v, solve_block) -> None:
    knobs = run.FusedKnobs(chunk_size=chunk_size, block_v=block_v, solve_block=solve_block)
    _check(run, _shape((70, 1, 33), hk=1, hv=2), knobs, seed=chunk_size)


@pytest.mark.parametrize("init", [True, False])
def test_context_parallel_segments_match_the_judge(run, init) -> None:
    """Segments of 32 tokens: local states, transitions, the combine walk and the output pass, with a sequence of
    one segment, an empty one and ones of 2 and 7 segments in the same batch."""
    knobs = run.FusedKnobs(chunk_size=16, block_v=16, cp_segment=32)
    _check(run, _shape((200, 0, 20, 64, 37), hk=1, hv=3), knobs, init=init, seed=3)


def test_float16_inputs(run) -> None:
    _check(run, _shape((65,), hk=2, hv=4), run.FusedKnobs(chunk_size=32, block_v=32), dtype=torch.float16)


def test_empty_sequence_keeps_its_initial_state(run) -> None:
    x = make_inputs(_shape((0, 5)), seed=5)
    o, state = run.gdn_prefill(**x.as_kwargs(), knobs=run.FusedKnobs(chunk_size=16, block_v=16))
    assert torch.equal(state[0], x.initial_state[0]) and o.shape == (5, 2, 32)


@pytest.mark.parametrize(("knobs", "message"), [
    (dict(block_v=48), "power of two"),
    (dict(block_v=64), "does not divide"),
    (dict(chunk_size=16, solve_block=32), "exceeds chunk_size"),
    (dict(chunk_size=32, block_v=32, cp_segment=48), "multiple of chunk_size"),
])
def test_bad_knobs_are_refused(run, knobs, message) -> None:
    x = make_inputs(_shape((8,)))
    with pytest.raises(ValueError, match=message):
        run.gdn_prefill(**x.as_kwargs(), knobs=run.FusedKnobs(**knobs))


def test_float32_inputs_are_refused(run) -> None:
    x = make_inputs(_shape((8,)), dtype=torch.float32)
    with pytest.raises(ValueError, match="bfloat16 or float16"):
        run.gdn_prefill(**x.as_kwargs(), knobs=run.FusedKnobs(block_v=32))


def test_cpu_without_the_interpreter_is_unsupported(monkeypatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    support = FusedTritonBackend().supports(_shape((8,)), torch.bfloat16, torch.device("cpu"))
    assert not support.is_ok and "TRITON_INTERPRET" in support.reason


def test_default_knobs_split_long_prompts_only_when_heads_are_few() -> None:
    tp8_long = GdnShape(seqlens=(32768,), num_key_heads=2, num_value_heads=8)
    tp1_batch = GdnShape(seqlens=(2048,) * 16, num_key_heads=16, num_value_heads=64)
    tp8_short = GdnShape(seqlens=(1024,), num_key_heads=2, num_value_heads=8)
    segment = dict(default_knobs(tp8_long))["cp_segment"]
    assert 512 <= segment <= 4096 and 32768 // segment * 8 * 2 >= 2 * 132
    assert "cp_segment" not in dict(default_knobs(tp1_batch))
    assert "cp_segment" not in dict(default_knobs(tp8_short))
    assert all(dict(k).get("cp_segment", 0) < 32768 for k in FusedTritonBackend().knob_space(tp8_long))
