"""verify: passes right backends, fails wrong ones (gate sign flipped, state not carried, NaN), reports the rest."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from hybridserve.cli.app import app
from hybridserve.core.model.dtypes import DType
from hybridserve.core.common.errors import CheckFailedError, CouldNotRunError
from hybridserve.core.model.profiles import load_model
from hybridserve.kernels import chunk_torch, registry
from hybridserve.kernels.backend import Capabilities, Support
from hybridserve.kernels.backend_torch import TorchBackend
from hybridserve.kernels.cases import case_matrix
from hybridserve.kernels.verify import Status, require_pass, run_verify

SMALL = dict(head_dim=32, long_len=200)


class GateFlipped(TorchBackend):
    name = "wrong-gate"

    def knob_space(self, shape):
        return [()]

    def prefill(self, q, k, v, g, beta, cu_seqlens, scale=None, initial_state=None, output_final_state=True,
                max_seqlen=None, **knobs):
        return chunk_torch.gdn_prefill(q, k, v, -g, beta, cu_seqlens, scale, initial_state, output_final_state)


class StateDropped(TorchBackend):
    """Ignores the initial state: right on fresh prompts, wrong as soon as a state must be carried in."""

    name = "wrong-state"

    def knob_space(self, shape):
        return [()]

    def prefill(self, q, k, v, g, beta, cu_seqlens, scale=None, initial_state=None, output_final_state=True,
                max_seqlen=None, **knobs):
        return chunk_torch.gdn_prefill(q, k, v, g, beta, cu_seqlens, scale, None, output_final_state)


class MakesNaN(TorchBackend):
    name = "nan"

    def knob_space(self, shape):
        return [()]

    def prefill(self, *args, **kwargs):
        o, s = super().prefill(*args, **kwargs)
        return o * float("nan"), s


class Raises(StateDropped):
    name = "raises"

    def prefill(self, *args, **kwargs):
        raise RuntimeError("kernel exploded")


class Only128(StateDropped):
    name = "only128"
    capabilities = Capabilities(devices=frozenset({"cpu"}), dtypes=frozenset({torch.bfloat16}),
                                head_dims=frozenset({128}))


def test_torch_backend_passes_the_matrix() -> None:
    cases = case_matrix(**SMALL, model=load_model("qwen3.5-0.8b"), tps=(4, 8), model_seqlens=(70, 0, 65))
    report = run_verify([TorchBackend()], cases, dtype=DType.BFLOAT16, device="cpu")
    assert report.is_ok and len(report.results) == 2 * len(cases)
    ids = {r.case_id for r in report.results}
    assert {"len1", "len63", "len65", "len200", "zero-len-inside", "varlen", "init-state", "gva3",
            "qwen3.5-0.8b-tp4", "qwen3.5-0.8b-tp8"} <= ids
    require_pass(report)  # does not raise


def test_flipped_gate_fails_every_multi_token_case() -> None:
    report = run_verify([GateFlipped()], case_matrix(**SMALL), device="cpu")
    failed = {r.case_id for r in report.failures}
    assert failed >= {"len63", "len65", "len200", "varlen", "gva3"}
    with pytest.raises(CheckFailedError) as info:
        require_pass(report)
    assert info.value.exit_code == 1 and "wrong-gate" in str(info.value)


def test_dropped_state_fails_exactly_the_cases_with_initial_state() -> None:
    cases = case_matrix(**SMALL)
    report = run_verify([StateDropped()], cases, device="cpu")
    expect = {c.case_id for c in cases if c.has_initial_state}
    assert {r.case_id for r in report.failures} == expect
    assert all(r.status is Status.PASS for r in report.results if r.case_id not in expect)


def test_nan_never_passes_even_with_a_huge_tolerance() -> None:
    report = run_verify([MakesNaN()], case_matrix(**SMALL)[:3], device="cpu", tolerance=1e30)
    assert [r.status for r in report.results] == [Status.FAIL] * 3


def test_raising_kernel_is_an_error_result_and_unsupported_is_reported_not_failed() -> None:
    cases = case_matrix(**SMALL)[:2]
    report = run_verify([Raises(), Only128()], cases, device="cpu")
    by = {(r.backend, r.case_id): r for r in report.results}
    assert by[("raises", "len1")].status is Status.ERROR and "kernel exploded" in by[("raises", "len1")].reason
    assert by[("only128", "len1")].status is Status.UNSUPPORTED and "128" in by[("only128", "len1")].reason
    assert {r.backend for r in report.failures} == {"raises"}


class Unavailable(StateDropped):
    name = "absent"

    def availability(self):
        return Support(is_ok=False, reason="package absent-kernels is not installed")


def test_no_available_backend_could_not_run() -> None:
    with pytest.raises(CouldNotRunError, match="absent-kernels"):
        run_verify([Unavailable()], case_matrix(**SMALL)[:1], device="cpu")


runner = CliRunner()
CLI = ["verify", "--device", "cpu", "--model", "qwen3.5-0.8b", "--tp", "8", "16", "--head-dim", "16",
       "--long-len", "100"]


def test_cli_json_passes_and_lists_the_cases() -> None:
    result = runner.invoke(app, [*CLI, "--backend", "torch", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["ok"] is True and data["dtype"] == "bfloat16"
    cases = {r["case"] for r in data["results"]}
    assert {"len100", "qwen3.5-0.8b-tp8", "qwen3.5-0.8b-tp16", "gva4"} <= cases


def test_cli_exits_1_on_a_wrong_backend_and_names_it() -> None:
    registry.register(GateFlipped())
    try:
        result = runner.invoke(app, [*CLI, "--backend", "wrong-gate"])
    finally:
        registry.unregister("wrong-gate")
    assert result.exit_code == 1
    assert "wrong-gate" in result.output and "FAIL" in result.output


@pytest.mark.parametrize("args, word", [(["--dtype", "int4"], "--dtype"), (["--backend", "nope"], "--backend"),
                                        (["--device", "tpu"], "--device"), (["--tp", "3"], "--tp")])
def test_cli_refuses_bad_input_with_exit_2(args: list[str], word: str) -> None:
    result = runner.invoke(app, ["verify", "--model", "qwen3.5-0.8b", *args])
    assert result.exit_code == 2 and word in result.output
