"""The FlashInfer and fla adapters' conversions, against stand-ins that follow each library's documented contract
(FlashInfer: linear gate, [N, H, V, K] state, and as measured on the H200 a wrong final state for an empty sequence
from FlashInfer 0.6.14's CP kernel; fla 0.6: a leading batch dim of 1, our gate and state layout). The real kernels
run in the H200 verify."""

from __future__ import annotations

import functools
import types

import pytest
import torch

from hybridserve.kernels import backend_fla, backend_flashinfer, backend_flashqla, chunk_torch, naive
from hybridserve.kernels.inputs import GdnShape, make_inputs
from hybridserve.kernels.error_metrics import assert_close


def fake_flashinfer(q, k, v, g=None, beta=None, scale=None, initial_state=None, output_final_state=False,
                    cu_seqlens=None, output_state=None, use_cp="auto", _cp_chunk_len=None, max_seqlen=None):
    assert cu_seqlens is not None and g.dtype == torch.float32 and bool((g > 0).all()) and bool((g <= 1).all())
    assert use_cp in ("auto", True, False) and isinstance(max_seqlen, int)
    o, state_kv = chunk_torch.gdn_prefill(q, k, v, torch.log(g), beta, cu_seqlens, scale,
                                          initial_state.transpose(-1, -2), True)
    out_state = output_state if output_state is not None and use_cp is not True else torch.full_like(
        initial_state, float("nan"))
    cu = cu_seqlens.tolist()
    for n in range(len(cu) - 1):
        if cu[n + 1] > cu[n]:  # an empty sequence's row: left as it was (plain kernel), garbage (CP kernel)
            out_state[n] = state_kv[n].transpose(-1, -2)
    return o, out_state


def fake_fla(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
    assert q.dim() == 4 and q.shape[0] == 1
    o, s = chunk_torch.gdn_prefill(q[0], k[0], v[0], g[0], beta[0], cu_seqlens, scale, initial_state,
                                   output_final_state)
    return o.unsqueeze(0), s


CASES = {"zero-len-inside": (40, 0, 129, 0, 3), "len65": (65,), "varlen": (31, 63, 93)}


@pytest.mark.parametrize("seqlens", [*CASES.values(), (0, 0)], ids=[*CASES, "all-empty"])
@pytest.mark.parametrize("has_init", [True, False], ids=["init", "no-init"])
@pytest.mark.parametrize("use_cp", [False, True], ids=["plain", "cp"])
def test_flashinfer_adapter_keeps_the_project_convention(monkeypatch, seqlens, has_init: bool, use_cp) -> None:
    fake = types.SimpleNamespace(chunk_gated_delta_rule=fake_flashinfer)
    monkeypatch.setattr(backend_flashinfer, "_load", lambda: fake)
    shape = GdnShape(seqlens=seqlens, num_key_heads=2, num_value_heads=6, key_head_dim=32, value_head_dim=16)
    x = make_inputs(shape, dtype=torch.float32, seed=9, has_initial_state=has_init)
    b = backend_flashinfer.FlashInferBackend()
    o, state = b.prefill(**x.as_kwargs(), max_seqlen=max(seqlens), use_cp=use_cp)
    o_ref, state_ref = naive.gdn_prefill(**x.as_kwargs())
    assert_close(o, o_ref, 1e-5, "o")
    assert_close(state, state_ref, 1e-5, "state")  # NaN rows (unwritten) would fail here


def fake_flashqla(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
                  auto_cp=True, force_intra_cp=False):
    """FlashQLA 0.1.3 as measured on the H200: an empty sequence in cu_seqlens is refused."""
    assert q.dim() == 4 and q.shape[0] == 1 and cu_seqlens.dtype == torch.int64
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
    if 0 in lengths:
        raise ValueError(f"invalid sequence lengths: {lengths}")
    if initial_state is not None:
        assert initial_state.shape[0] == len(lengths)
    o, s = chunk_torch.gdn_prefill(q[0], k[0], v[0], g[0], beta[0], cu_seqlens, scale, initial_state,
                                   output_final_state)
    return o.unsqueeze(0), s


@pytest.mark.parametrize("seqlens", [*CASES.values(), (0, 0)], ids=[*CASES, "all-empty"])
@pytest.mark.parametrize("has_init", [True, False], ids=["init", "no-init"])
def test_flashqla_adapter_passes_over_empty_sequences(monkeypatch, seqlens, has_init: bool) -> None:
    """Empty sequences never reach FlashQLA; their final state is their initial one (zeros without one)."""
    monkeypatch.setattr(backend_flashqla, "_load", lambda: types.SimpleNamespace(chunk_gated_delta_rule=fake_flashqla))
    shape = GdnShape(seqlens=seqlens, num_key_heads=2, num_value_heads=6, key_head_dim=32, value_head_dim=32)
    x = make_inputs(shape, dtype=torch.float32, seed=4, has_initial_state=has_init)
    b = backend_flashqla.FlashQlaBackend()
    o, state = b.prefill(**x.as_kwargs(), auto_cp=True)
    o_ref, state_ref = naive.gdn_prefill(**x.as_kwargs())
    assert_close(o, o_ref, 1e-5, "o")
    assert_close(state, state_ref, 1e-5, "state")
    assert b.prefill(**x.as_kwargs())[0].shape == o.shape  # the second call reuses the prepared cu_seqlens


def test_fla_adapter_keeps_the_project_convention(monkeypatch) -> None:
    monkeypatch.setattr(backend_fla, "_load", lambda: types.SimpleNamespace(chunk_gated_delta_rule=fake_fla))
    x = make_inputs(GdnShape(seqlens=CASES["zero-len-inside"], num_key_heads=1, num_value_heads=3, key_head_dim=16,
                             value_head_dim=16), dtype=torch.float32, seed=10)
    o, state = backend_fla.FlaBackend().prefill(**x.as_kwargs())
    o_ref, state_ref = naive.gdn_prefill(**x.as_kwargs())
    assert_close(o, o_ref, 1e-5, "o")
    assert_close(state, state_ref, 1e-5, "state")


def _fake_flashinfer(monkeypatch, with_cp_chunk_len: bool) -> dict:
    """flashinfer.gdn_prefill stand-in: 0.7 (takes _cp_chunk_len, max_seqlen) or 0.6 (vLLM 0.26's pin: neither)."""
    seen: dict = {}

    def v06(q, k, v, g=None, beta=None, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
            use_qk_l2norm_in_kernel=False, output=None, output_state=None, use_cp="auto"):
        seen.update(use_cp=use_cp)
        return torch.zeros_like(v), initial_state

    def v07(q, k, v, g=None, beta=None, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
            use_qk_l2norm_in_kernel=False, output=None, output_state=None, use_cp="auto", _cp_chunk_len=None,
            max_seqlen=None):
        seen.update(use_cp=use_cp, cp_chunk_len=_cp_chunk_len, max_seqlen=max_seqlen)
        return torch.zeros_like(v), initial_state

    module = types.SimpleNamespace(chunk_gated_delta_rule=v07 if with_cp_chunk_len else v06)
    monkeypatch.setattr(backend_flashinfer, "_load", lambda: module)
    backend_flashinfer._accepts.cache_clear()
    monkeypatch.setattr(backend_flashinfer, "_accepts", functools.cache(backend_flashinfer._accepts.__wrapped__))
    return seen


@pytest.mark.parametrize("version", ["0.7", "0.6"])
def test_flashinfer_knobs_and_keywords_follow_the_installed_version(monkeypatch, version) -> None:
    seen = _fake_flashinfer(monkeypatch, with_cp_chunk_len=version == "0.7")
    b = backend_flashinfer.FlashInferBackend()
    space = b.knob_space(GdnShape(seqlens=(1500, 20), num_key_heads=1, num_value_heads=1))
    assert space[0] == (("use_cp", "auto"),)  # FlashInfer's own default first: what vLLM runs
    assert ((("use_cp", True), ("cp_chunk_len", 1024)) in space) == (version == "0.7")
    assert (("use_cp", True), ("cp_chunk_len", 2048)) not in space
    x = make_inputs(GdnShape(seqlens=(5, 3), num_key_heads=1, num_value_heads=1, key_head_dim=8, value_head_dim=8))
    b.prefill(**x.as_kwargs(), max_seqlen=5, **dict(space[-1]))
    assert seen == ({"use_cp": True, "cp_chunk_len": 1024, "max_seqlen": 5} if version == "0.7" else {"use_cp": True})


def test_gpu_backends_report_why_they_are_unavailable_here() -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    for b in (backend_fla.FlaBackend(), backend_flashinfer.FlashInferBackend()):
        ok, reason = b.availability()
        assert not ok and reason
