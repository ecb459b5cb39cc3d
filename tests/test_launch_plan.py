"""The launch plan: command lines vLLM's own parser accepts, the environment per role, topology files."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hybridserve.cli.app import app
from hybridserve.core.common.errors import InputError
from hybridserve.core.launch.launch_plan import Role, make_launch_plan
from hybridserve.core.launch.topology import Device, TINY_MODEL_DIR
from hybridserve.core.launch.topology_file import load_topology
from hybridserve.core.vllm_plugin import torchvision_shim

runner = CliRunner()


def _dry_run_json(*args: str) -> dict:
    result = runner.invoke(app, ["launch", "--dry-run", "--json", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def vllm_parse():
    """vLLM's own `api_server` parser (make_arg_parser on a FlexibleArgumentParser) and its validation."""
    torchvision_shim.install_lazy()  # vllm.config imports torchvision (see the shim)
    pytest.importorskip("vllm", reason="needs the cpu or cuda extra")
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    def parse(argv: list[str]):
        args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
        validate_parsed_serve_args(args)
        return args, AsyncEngineArgs.from_cli_args(args)

    return parse


def test_dry_run_is_accepted_by_vllms_parser(vllm_parse):
    commands = {c["name"]: c for c in _dry_run_json("--role", "all", "--base-port", "41000")["commands"]}
    for name, role in (("prefill-0", "kv_producer"), ("decode-0", "kv_consumer")):
        argv = commands[name]["argv"]
        assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
        args, engine = vllm_parse(argv[3:])
        assert engine.kv_transfer_config.kv_connector == "NixlConnector"
        assert engine.kv_transfer_config.kv_role == role
        assert engine.kv_transfer_config.kv_buffer_device == "cpu"
        assert engine.kv_transfer_config.kv_load_failure_policy == "fail"
        assert engine.kv_transfer_config.kv_connector_extra_config["kv_lease_duration"] == 30
        # tiny model, fp32 SSM on CPU: vLLM raises 128 to 256 tokens (conv 3,072 B + SSM 65,536 B per layer
        # does not fit 128 x 512 B/token, fits 2 x 128); we pass the result so both sides get exactly it
        assert engine.block_size == commands[name]["block_size"] == 256
        assert (engine.mamba_ssm_cache_dtype, engine.mamba_cache_dtype) == ("float32", "bfloat16")
        assert engine.disable_hybrid_kv_cache_manager is False and engine.enable_prefix_caching is False
        assert engine.async_scheduling is False
        assert args.port == int(commands[name]["url"].rsplit(":", 1)[1])
    async_argv = _dry_run_json("--role", "decode", "--async-scheduling")["commands"][0]["argv"]
    assert vllm_parse(async_argv[3:])[1].async_scheduling is True


def test_roles_get_distinct_cores_side_channels_and_ds_layout():
    plan = make_launch_plan(load_topology_text(LOCAL_YAML), Role.ALL)
    prefill, decode = (dict(plan.command(n).env) for n in ("prefill-0", "decode-0"))
    assert prefill["VLLM_SSM_CONV_STATE_LAYOUT"] == decode["VLLM_SSM_CONV_STATE_LAYOUT"] == "DS"
    assert (prefill["VLLM_CPU_OMP_THREADS_BIND"], decode["VLLM_CPU_OMP_THREADS_BIND"]) == ("0", "1")
    assert (prefill["HYBRIDSERVE_CPU_CORES"], decode["HYBRIDSERVE_CPU_CORES"]) == ("0", "1")
    assert (prefill["VLLM_NIXL_SIDE_CHANNEL_HOST"], decode["VLLM_NIXL_SIDE_CHANNEL_HOST"]) == ("127.0.0.2", "127.0.0.3")
    assert (prefill["VLLM_NIXL_SIDE_CHANNEL_PORT"], decode["VLLM_NIXL_SIDE_CHANNEL_PORT"]) == ("5610", "5611")
    assert prefill["PYTHONPATH"].endswith("vllm_plugin/startup")
    # decode gives back a dead prefill's NIXL state (peer_release.py); on CPU no cuda_ipc cache to switch off
    assert (prefill.get("HYBRIDSERVE_RELEASE_DEAD_PEERS"), decode["HYBRIDSERVE_RELEASE_DEAD_PEERS"]) == (None, "1")
    assert "UCX_CUDA_IPC_CACHE" not in decode and "HYBRIDSERVE_PIN_PEER_REGIONS" not in decode  # DRAM: no cuda_ipc
    proxy = plan.command("proxy").argv
    assert proxy[proxy.index("--prefill") + 1] == "http://127.0.0.2:8110"
    assert proxy[proxy.index("--decode") + 1] == "http://127.0.0.3:8210"


def test_plugin_fixes_off_leaves_vllm_stock():
    plan = make_launch_plan(load_topology_text(LOCAL_YAML + "engine: {plugin_fixes: false}\n"), Role.DECODE)
    env = dict(plan.commands[0].env)
    assert "HYBRIDSERVE_NIXL_PROGRESS_DELAY_US" not in env and "HYBRIDSERVE_CPU_CORES" not in env
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "1"  # pinning is launch's, not a plugin fix


def test_topology_index_selects_one_instance():
    text = LOCAL_YAML.replace("decode:\n", "  - {host: 127.0.0.4, port: 8120, side_channel_port: 5612, devices: [0]}\n"
                                           "decode:\n")
    plan = make_launch_plan(load_topology_text(text), Role.PREFILL, index=1)
    assert [c.name for c in plan.commands] == ["prefill-1"]
    assert plan.commands[0].url == "http://127.0.0.4:8120"
    with pytest.raises(InputError, match="--index 2: the topology has 2 prefill instance"):
        make_launch_plan(load_topology_text(text), Role.PREFILL, index=2)


@pytest.mark.parametrize("text,expected", [
    ("model: x\nprefill: []\ndecode: []\n", "prefill: accepted: a non-empty list"),
    ("prefill:\n  - {host: h, port: 1, side_channel_port: 2, gpu: 0}\n", "unknown key 'gpu'"),
    ("prefill:\n  - {host: h, side_channel_port: 2}\n", "port is missing"),
    ("device: tpu\n", "--device tpu: accepted: cpu, cuda"),
], ids=["empty", "unknown-key", "no-port", "bad-device"])
def test_topology_file_refusals(tmp_path, text, expected):
    path = tmp_path / "t.yaml"
    path.write_text(text)
    with pytest.raises(InputError, match=expected):
        load_topology(path)


def test_cli_bad_role_is_one_line_exit_2():
    result = runner.invoke(app, ["launch", "--role", "both", "--dry-run"])
    assert result.exit_code == 2
    assert "--role both: accepted: prefill, decode, proxy, all" in result.output


def test_cli_passes_request_on(monkeypatch):
    seen = {}

    def fake_prepare(request):
        seen["request"] = request
        return make_launch_plan(load_topology_text(LOCAL_YAML), request.role)

    monkeypatch.setattr("hybridserve.cli.launch.prepare_launch", fake_prepare)
    result = runner.invoke(app, ["launch", "--role", "proxy", "--dry-run", "--mamba-ssm-cache-dtype", "bf16",
                                 "--no-plugin-fixes", "--base-port", "9000"])
    assert result.exit_code == 0, result.output
    request = seen["request"]
    assert (request.role, request.base_port, request.is_dry_run) == (Role.PROXY, 9000, True)
    assert request.engine.ssm_dtype.value == "bfloat16" and request.engine.is_plugin_fixes is False
    assert "hybridserve.core.proxy" in result.stdout


LOCAL_YAML = textwrap.dedent("""\
    device: cpu
    prefill:
      - {host: 127.0.0.2, port: 8110, side_channel_port: 5610, devices: [0]}
    decode:
      - {host: 127.0.0.3, port: 8210, side_channel_port: 5611, devices: [1]}
    proxy: {host: 127.0.0.1, port: 8010, policy: least_outstanding}
    """)


def load_topology_text(text: str):
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.yaml"
        path.write_text(text)
        topology = load_topology(path)
    assert topology.model == TINY_MODEL_DIR.resolve() and topology.device is Device.CPU
    return topology


@pytest.mark.parametrize("cores,tp,expected", [((0,), 1, "0"), ((0, 1, 2, 3), 2, "0,1|2,3"), ((0, 1, 2), 2, "0|1"),
                                               ((5,), 2, "5|5")])
def test_cpu_cores_are_split_per_tp_rank(cores, tp, expected):
    from hybridserve.core.launch.engine_command import omp_threads_bind

    assert omp_threads_bind(cores, tp) == expected
