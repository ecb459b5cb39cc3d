"""`launch --vllm-arg ...` and `launch -- ...`: vLLM flags reach every engine's argv; a flag launch sets is refused,
naming the option that sets it. The refused set is the list that writes the command line (engine_flags)."""

from __future__ import annotations

import json
import textwrap
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from hybridserve.cli.app import app
from hybridserve.core.common.errors import InputError
from hybridserve.core.deployments.target import RECALL_MODEL_DIR
from hybridserve.core.host.vllm_version import V0_26, V0_32
from hybridserve.core.launch.engine_command import EngineFlag, engine_flags
from hybridserve.core.launch.launch_plan import Role, make_launch_plan
from hybridserve.core.launch.passthrough import check_passthrough, flag_name, owner, passed_value
from hybridserve.core.launch.placement import placements
from hybridserve.core.launch.topology import Device, EngineOptions, Topology, local_topology
from hybridserve.core.layout.attention_backend import AttentionBackend

runner = CliRunner()
ENGINES = ("prefill-0", "decode-0")


def _invoke(*args: str):
    return runner.invoke(app, ["launch", "--dry-run", *args])


def _argvs(*args: str) -> dict[str, list[str]]:
    result = _invoke("--json", *args)
    assert result.exit_code == 0, result.output
    return {c["name"]: c["argv"] for c in json.loads(result.stdout)["commands"]}


def test_acceptance_vllm_arg_reaches_every_engine_and_not_the_proxy():
    """Issue 21's acceptance line, as written (no --role: all)."""
    argvs = _argvs("--vllm-arg=--load-format", "--vllm-arg=dummy")
    for name in ENGINES:
        argv = argvs[name]
        assert argv[argv.index("--load-format") + 1] == "dummy"
        assert argv.count("--load-format") == 1
    assert "--load-format" not in argvs["proxy"]


@pytest.mark.parametrize("args", [
    ("--vllm-arg", "--load-format", "--vllm-arg", "dummy", "--", "--max-loras", "2"),
    ("--vllm-arg=--load-format", "--vllm-arg=dummy", "--", "--max-loras=2"),
    ("--", "--load-format", "dummy", "--max-loras", "2"),
], ids=["spaced-then-dashes", "equals-then-dashes", "dashes-only"])
def test_both_forms_land_last_in_order_on_every_engine(args):
    argvs = _argvs(*args)
    passed = [a for a in args if a not in ("--vllm-arg", "--")]
    passed = [a.removeprefix("--vllm-arg=") for a in passed]
    for name in ENGINES:
        assert argvs[name][-len(passed):] == passed


def test_single_role_gets_them_too():
    argvs = _argvs("--role", "single", "--", "--load-format", "dummy")
    assert list(argvs) == ["single-0"] and argvs["single-0"][-2:] == ["--load-format", "dummy"]


def test_topology_engine_vllm_args_come_before_the_command_lines(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(textwrap.dedent(f"""\
        model: {RECALL_MODEL_DIR}
        engine: {{vllm_args: [--load-format, dummy]}}
        prefill: [{{port: 18100, side_channel_port: 18150, extra_args: [--max-loras, '3']}}]
        decode: [{{port: 18200, side_channel_port: 18250}}]
        """))
    argvs = _argvs("--topology", str(path), "--", "--max-lora-rank", "8")
    assert argvs["prefill-0"][-6:] == ["--load-format", "dummy", "--max-lora-rank", "8", "--max-loras", "3"]
    assert argvs["decode-0"][-4:] == ["--load-format", "dummy", "--max-lora-rank", "8"]


@pytest.mark.parametrize("passed, flag, set_by", [
    (("--vllm-arg=--port=9100",), "--port", "--base-port"),
    (("--", "--max_model_len", "4096"), "--max-model-len", "--max-model-len"),
    (("--", "--max-model", "4096"), "--max-model-len", "--max-model-len"),  # argparse's abbreviation
    (("--", "-tp", "2"), "--tensor-parallel-size", "topology: tp"),
    (("--", "--kv-transfer-config.kv_role", "kv_both"), "--kv-transfer-config", "--role"),
    (("--", "--enable-prefix-caching"), "--enable-prefix-caching", "always off"),
    (("--", "--no-async-scheduling"), "--async-scheduling", "--async-scheduling"),
    (("--", "--host", "0.0.0.0"), "--host", "topology: host"),
    (("--", "--model", "/x"), "--model", "--model"),
    (("--", "--attention-backend", "TRITON_ATTN"), "--attention-backend", "--attention-backend"),
    (("--", "--kv-cache-dtype", "fp8"), "--kv-cache-dtype", "--kv-cache-dtype"),  # launch leaves vLLM's auto
    (("--", "-sc", "{}"), "--speculative-config", "--num-speculative-tokens"),
], ids=lambda v: v if isinstance(v, str) else " ".join(v))
def test_a_flag_launch_sets_is_refused_naming_it_and_its_option(passed, flag, set_by):
    result = _invoke(*passed)
    assert result.exit_code == 2, result.output
    line = result.output.strip()
    assert "\n" not in line and "Traceback" not in line
    assert f"launch sets {flag} itself" in line and set_by in line


def test_placement_flags_are_owned_where_placement_writes_them(tmp_path):
    cuda = tmp_path / "cuda.yaml"
    cuda.write_text(f"model: {RECALL_MODEL_DIR}\ndevice: cuda\nprefill: [{{port: 18100, side_channel_port: 18150, "
                    f"devices: [0]}}]\ndecode: [{{port: 18200, side_channel_port: 18250, devices: [0]}}]\n")
    result = _invoke("--topology", str(cuda), "--", "--gpu-memory-utilization", "0.5")
    assert result.exit_code == 2 and "launch sets --gpu-memory-utilization itself" in result.output
    result = _invoke("--vllm-version", "0.26", "--", "--language-model-only")
    assert result.exit_code == 2 and "vLLM 0.26" in result.output
    assert _invoke("--vllm-version", "0.32", "--", "--language-model-only").exit_code == 0


def test_instance_extra_args_are_checked_the_same_way(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(f"prefill: [{{port: 18100, side_channel_port: 18150}}]\ndecode: [{{port: 18200, "
                    f"side_channel_port: 18250, extra_args: ['--seed=3']}}]\n")
    result = _invoke("--topology", str(path))
    assert result.exit_code == 2 and "decode extra_args --seed=3: launch sets --seed itself" in result.output


def test_a_stray_word_is_refused_and_values_are_not_flags():
    result = _invoke("dummy")
    assert result.exit_code == 2 and "dummy: unexpected argument" in result.output
    assert _invoke("--", "--hf-overrides", '{"x": -1}', "--max-loras", "-1").exit_code == 0
    assert [flag_name(t) for t in ("dummy", "-1", "--a_b.c=1", "--no-x", "-tp")] == [None, None, "--a-b", "--x", "-tp"]


CONFIGS = {
    "cpu-all": (local_topology(), Role.ALL, V0_32),
    "cpu-single": (local_topology(), Role.SINGLE, V0_32),
    "cuda-0.26-every-option": (local_topology(device=Device.CUDA, num_gpus=2, engine=EngineOptions(
        is_async_scheduling=True, is_enforce_eager=True, attention_backend=AttentionBackend.FLASH_ATTN,
        gdn_prefill_backend="triton", num_speculative_tokens=1)), Role.ALL, V0_26),
}


def _with_args(topology: Topology, args: tuple[str, ...]) -> Topology:
    return replace(topology, engine=replace(topology.engine, vllm_args=args))


@pytest.mark.parametrize("config", CONFIGS)
def test_every_flag_in_the_built_command_line_is_refused_when_passed(config):
    """The drift guard: a flag written outside engine_flags / placement's flags would pass through unrefused."""
    topology, role, vllm = CONFIGS[config]
    plan = make_launch_plan(topology, role, vllm=vllm, python="python")
    engines = [c for c in plan.commands if c.role.is_engine]
    written = {a for c in engines for a in c.argv[3:] if flag_name(a)}
    assert {"--model", "--port", "--block-size"} <= written
    for flag in sorted(written):
        with pytest.raises(InputError, match=f"launch sets {flag_name(flag)} itself"):
            make_launch_plan(_with_args(topology, (flag,)), role, vllm=vllm, python="python")


def _owned(topology: Topology, vllm) -> tuple[EngineFlag, ...]:  # noqa: ANN001
    """What launch decides for decode-0: its flags and placement's."""
    plan = make_launch_plan(topology, Role.ALL, vllm=vllm, python="python")
    inst = topology.decode[0]
    place = placements(topology, [("decode-0", "decode", inst)], vllm)["decode-0"]
    return engine_flags("decode", place.topology, inst, plan.command("decode-0").cache) + place.extra_flags


def test_passed_value_reads_the_last_one():
    assert passed_value(("--load-format", "auto", "--load_format=dummy"), "--load-format") == "dummy"
    assert passed_value(("--max-loras", "2"), "--load-format") is None


def test_vllms_parser_knows_every_owned_flag_and_nothing_else_is_refused():
    """Against the installed vLLM's own parser: no owned name is stale, and no other vLLM flag (or its
    abbreviations, which argparse accepts) is refused by the prefix rule."""
    from hybridserve.core.vllm_plugin import torchvision_shim

    torchvision_shim.install_lazy()
    pytest.importorskip("vllm", reason="needs the cpu or cuda extra")
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser())
    options = {o for action in parser._actions for o in action.option_strings}
    topology, _, vllm = CONFIGS["cuda-0.26-every-option"]
    owned = _owned(topology, vllm)
    assert {"--gpu-memory-utilization", "--language-model-only", "--speculative-config"} <= {f.name for f in owned}
    assert {f.name for f in owned} | {a for f in owned for a in f.aliases} <= options
    for option in options:
        flag = owner(option, owned)
        if flag is not None:
            assert option in {flag.name, f"--no-{flag.name[2:]}", *flag.aliases}, option
    with pytest.raises(InputError):
        check_passthrough(("--block", "16"), owned, what="x")  # argparse would read it as --block-size
    assert parser.parse_args(["--model", "m", "--block", "32"]).block_size == 32
