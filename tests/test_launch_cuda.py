"""CUDA hosts on a CPU machine: the dry run trusts the topology file; a real start checks the GPUs; transfer bench
refuses VRAM without CUDA; rank processes take UCX's environment and stdout file; a TCP-fallback row is marked."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hybridserve.cli.app import app
from hybridserve.core.common.errors import InputError
from hybridserve.core.deployments.target import RECALL_MODEL_DIR
from hybridserve.core.launch.gpu_shares import MAX_TOTAL_SHARE
from hybridserve.core.launch.launch_plan import Role
from hybridserve.core.launch.machine import machine_plan
from hybridserve.core.launch.topology_file import load_topology

runner = CliRunner()


def _topology_file(tmp_path, devices=(0, 0), extra=""):
    path = tmp_path / "t.yaml"
    path.write_text(textwrap.dedent(f"""\
        model: {RECALL_MODEL_DIR}
        device: cuda
        engine: {{enforce_eager: true{extra}}}
        prefill:
          - {{port: 18100, side_channel_port: 18150, devices: [{devices[0]}]}}
        decode:
          - {{port: 18200, side_channel_port: 18250, devices: [{devices[1]}]}}
        proxy: {{port: 18000}}
        """))
    return path


def test_dry_run_puts_both_roles_on_gpu_0_with_shares_and_cuda_ipc(tmp_path):
    """Issue 14's acceptance on a machine without GPUs: the file is the authority for a dry run."""
    result = runner.invoke(app, ["launch", "--topology", str(_topology_file(tmp_path)), "--role", "all",
                                 "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    engines = [c for c in json.loads(result.stdout)["commands"] if c["role"] in ("prefill", "decode")]
    assert [c["gpus"] for c in engines] == [[0], [0]]
    shares = [float(c["argv"][c["argv"].index("--gpu-memory-utilization") + 1]) for c in engines]
    assert shares == [c["gpu_memory_utilization"] for c in engines] and sum(shares) <= MAX_TOTAL_SHARE
    for c in engines:
        assert c["env"]["CUDA_VISIBLE_DEVICES"] == "0"
        assert c["env"]["UCX_CUDA_IPC_ENABLE_GET_ZCOPY"] == "y" and c["env"]["UCX_PROTO_INFO"] == "y"
        # decode READs from prefill: without cuda_ipc's mapping cache it can give a dead prefill's memory back
        is_decode = c["role"] == "decode"
        assert c["env"].get("UCX_CUDA_IPC_CACHE") == ("n" if is_decode else None)
        assert c["env"].get("HYBRIDSERVE_RELEASE_DEAD_PEERS") == ("1" if is_decode else None)
        # and it holds its live prefills' KV allocations open, so that a READ opens none (peer_pin.py)
        assert c["env"].get("HYBRIDSERVE_PIN_PEER_REGIONS") == ("1" if is_decode else None)
        assert "--enforce-eager" in c["argv"]
        assert json.loads(c["argv"][c["argv"].index("--kv-transfer-config") + 1])["kv_buffer_device"] == "cuda"


def test_a_topology_env_turns_decodes_peer_pin_off(tmp_path):
    path = _topology_file(tmp_path)
    path.write_text(path.read_text().replace("side_channel_port: 18250,",
                                             "side_channel_port: 18250, env: {HYBRIDSERVE_PIN_PEER_REGIONS: '0'},"))
    result = runner.invoke(app, ["launch", "--topology", str(path), "--role", "decode", "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    decode = next(c for c in json.loads(result.stdout)["commands"] if c["role"] == "decode")
    assert decode["env"]["HYBRIDSERVE_PIN_PEER_REGIONS"] == "0" and decode["env"]["UCX_CUDA_IPC_CACHE"] == "n"


def test_dry_run_writes_the_026_command_line_when_asked(tmp_path):
    result = runner.invoke(app, ["launch", "--topology", str(_topology_file(tmp_path)), "--role", "decode",
                                 "--dry-run", "--json", "--vllm-version", "0.26.0"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["vllm"] == "0.26" and "--language-model-only" in data["commands"][0]["argv"]


def test_unknown_vllm_version_is_warned_in_one_line(tmp_path):
    result = runner.invoke(app, ["launch", "--topology", str(_topology_file(tmp_path)), "--role", "decode",
                                 "--dry-run", "--json", "--vllm-version", "0.30"])
    assert result.exit_code == 0
    assert "warning: vLLM 0.30 (given) is not a version launch was checked against" in result.stderr


def test_real_start_refuses_a_gpu_this_host_lacks(tmp_path):
    topology = load_topology(_topology_file(tmp_path, devices=(0, 1)))
    machine_plan(topology, Role.ALL, is_dry_run=True, num_gpus=1)  # the dry run trusts the file
    with pytest.raises(InputError) as err:
        machine_plan(topology, Role.ALL, num_gpus=1)
    assert str(err.value) == "decode-0: GPU 1 does not exist; this host has GPUs 0..0"


def test_topology_shares_over_095_are_refused(tmp_path):
    path = _topology_file(tmp_path, extra=", gpu_memory_utilization: 0.97")
    result = runner.invoke(app, ["launch", "--topology", str(path), "--role", "all", "--dry-run"])
    assert result.exit_code == 2
    assert "--gpu-memory-utilization 0.97: accepted: more than 0, at most 0.95" in result.output


def test_plan_gives_capacity_per_share(tmp_path):
    def capacity(*extra: str) -> dict:
        result = runner.invoke(app, ["plan", "-m", "qwen3.5-0.8b", "--memory", "h200", "--prompt-len", "8192",
                                     "--json", *extra])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    alone, shared = capacity(), capacity("--roles-per-gpu", "2")
    assert (alone["capacity"]["gpu_memory_utilization"], shared["capacity"]["gpu_memory_utilization"]) == (0.92, 0.46)
    assert shared["requests"][0]["max_requests"] < alone["requests"][0]["max_requests"]
    # the H200 as vLLM sees it (profiles/hardware.yaml): 139.8 GiB
    assert shared["capacity"]["kv_cache_bytes"] == int(int(139.8 * 2**30) * 0.46) - shared["capacity"]["weights_bytes"]


def test_transfer_bench_vram_without_cuda_is_one_line_exit_2():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    result = runner.invoke(app, ["transfer", "bench", "-m", "qwen3.5-0.8b", "--memory", "vram"])
    assert result.exit_code == 2
    out = result.output.strip()
    assert out.startswith("error: --memory vram needs CUDA:") and "\n" not in out and "Traceback" not in out


def test_rank_process_takes_ucx_env_and_stdout_file(tmp_path):
    """What UcxCapture hands each rank: the variables are set before NIXL starts, stdout goes to its file."""
    from hybridserve.transfer.rank import RankGroup
    from hybridserve.transfer.ucx_capture import UcxCapture

    capture = UcxCapture(memory="cuda", keep_at=tmp_path / "ucx.log")
    with RankGroup() as group:
        rank = group.start("decode", 0, device="cpu", **capture.options("decode", 0))
        rank.call("flush_stdout", 30)
    assert capture.env["UCX_CUDA_IPC_ENABLE_GET_ZCOPY"] == "y"
    assert (capture.dir / "decode0.log").exists()  # the rank's stdout went to its file
    fallback = (Path(__file__).parent / "data" / "ucx_h200_tcp_fallback.log").read_text()
    (capture.dir / "decode0.log").write_text(fallback)
    assert capture.transport().value == "tcp"
    capture.close()
    assert not capture.dir.exists() and "software emulation" in (tmp_path / "ucx.log").read_text()


def test_bench_marks_a_tcp_fallback_row():
    from dataclasses import replace

    from hybridserve.transfer import report
    from hybridserve.transfer.xfer_bench import BenchResult, BenchRow

    row = BenchRow(prompt_tokens=32768, scheme="ours", allocation="contiguous", num_requests=1, num_descriptors=60,
                   num_elements=60, num_merged=60, predicted_descriptors=60, num_bytes=1_104_322_560, prepare_ms=0.1,
                   post_ms=0.2, transfer_ms=2135.3, gbps=0.5, copy_gbps=2066.9, is_exact=True, transport="tcp")
    result = BenchResult(model="qwen3.5-397b-a17b", prefill_tp=1, decode_tp=1, memory="vram", backend="flashinfer",
                         block_size=1072, kernel_block_size=16, page_size_bytes=2_195_456, num_tensors=15,
                         rows=(row, replace(row, transport="cuda_ipc", gbps=1230.4)))
    assert [r["is_tcp_fallback"] for r in report.result_dict(result)["rows"]] == [True, False]
    assert [report.transport_cell(r) for r in result.rows] == ["[bold red]tcp FALLBACK[/]", "cuda_ipc"]


def test_cuda_argv_parses_with_vllm_032s_own_parser(tmp_path):
    """The flags launch adds on CUDA (share, eager) are ones vLLM 0.32's api_server parser takes as given."""
    from hybridserve.core.vllm_plugin import torchvision_shim

    torchvision_shim.install_lazy()  # vllm.config imports torchvision (see the shim)
    pytest.importorskip("vllm", reason="needs the cpu or cuda extra")
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    plan = machine_plan(load_topology(_topology_file(tmp_path)), Role.ALL, is_dry_run=True, vllm="0.32.0")
    for command in plan.commands[:2]:
        args = make_arg_parser(FlexibleArgumentParser()).parse_args(list(command.argv[3:]))
        engine = AsyncEngineArgs.from_cli_args(args)
        assert engine.gpu_memory_utilization == command.gpu_memory_utilization == 0.46
        assert engine.enforce_eager and engine.kv_transfer_config.kv_buffer_device == "cuda"
