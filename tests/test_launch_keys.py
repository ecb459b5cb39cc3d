"""Who may talk to a deployment, as launch plans it (core/launch/keys.py): the front key by --api-key-file or the
topology, the engines' key from the topology or generated per deployment, and no key in any command line, dry run,
plan.json or error message. The proxy's and the engines' doors themselves: tests/test_proxy_auth.py."""

from __future__ import annotations

import json
import os
import stat
import sys
import textwrap
import types
import urllib.request
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hybridserve.cli.app import app
from hybridserve.core.common.errors import InputError
from hybridserve.core.launch import keys
from hybridserve.core.launch.engine_command import ENGINE_GUARD
from hybridserve.core.launch.launch_plan import Role, RoleCommand, make_launch_plan
from hybridserve.core.launch.preflight import preflight
from hybridserve.core.launch.request import LaunchRequest, prepare_launch
from hybridserve.core.launch.topology_file import load_topology
from hybridserve.core.supervise.process import child_env
from hybridserve.core.supervise.runner import started

runner = CliRunner()
FRONT_KEY = "front-" + "f" * 26
ENGINE_KEY = "engine-" + "e" * 25


@pytest.fixture
def key_files(tmp_path):
    front, engine = tmp_path / "front.key", tmp_path / "engine.key"
    front.write_text(FRONT_KEY + "\n")
    engine.write_text(ENGINE_KEY + "\n")
    return front, engine


def _invoke(*args: str):
    return runner.invoke(app, ["launch", "--dry-run", *args])


def _topology(tmp_path: Path, proxy: str = "", engine: str = "", env: str = "") -> Path:
    path = tmp_path / "t.yaml"
    path.write_text(textwrap.dedent(f"""\
        device: cpu
        engine: {{max_model_len: 2048{engine}}}
        prefill:
          - {{host: 127.0.0.2, port: 8110, side_channel_port: 5610, devices: [0]{env}}}
        decode:
          - {{host: 127.0.0.3, port: 8210, side_channel_port: 5611, devices: [1]}}
        proxy: {{host: 127.0.0.1, port: 8010{proxy}}}
        """))
    return path


def test_without_a_key_file_the_dry_run_says_the_deployment_is_open():
    result = _invoke("--json")
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["access"]["is_open"] is True and plan["access"]["engine_key_file"] is None
    assert plan["access"]["lines"][0].startswith("access: open (no --api-key-file)")
    for command in plan["commands"]:  # the command lines of today: no guard, no key file, no secret variable
        assert command["secret_env"] == {} and "--middleware" not in command["argv"]
        assert not any("key" in arg for arg in command["argv"])
    text = _invoke().stdout
    assert "# access: open (no --api-key-file): the proxy and the engines answer anyone" in text
    assert "NIXL side channels (127.0.0.1:8150, 127.0.0.1:8250)" in text and "private network" in text


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_a_guarded_dry_run_names_the_files_and_holds_no_key(key_files, as_json):
    front, _ = key_files
    result = _invoke("--api-key-file", str(front), *(["--json"] if as_json else []))
    assert result.exit_code == 0, result.output
    assert FRONT_KEY not in result.output
    if not as_json:
        assert f"the proxy asks for the key in {front.resolve()}" in result.stdout
        assert 'VLLM_API_KEY="$(cat engine.key)"' in result.stdout  # how the engines get it, not what it is
        return
    plan = json.loads(result.stdout)
    assert plan["access"]["is_open"] is False and plan["access"]["is_engine_key_generated"] is True
    commands = {c["name"]: c for c in plan["commands"]}
    for name in ("prefill-0", "decode-0"):
        argv = commands[name]["argv"]
        assert argv[argv.index("--middleware") + 1] == ENGINE_GUARD
        assert "VLLM_API_KEY" not in commands[name]["env"] and list(commands[name]["secret_env"]) == ["VLLM_API_KEY"]
    proxy = commands["proxy"]["argv"]
    assert proxy[proxy.index("--api-key-file") + 1] == str(front.resolve())
    assert proxy[proxy.index("--engine-key-file") + 1] == "engine.key"  # in the run folder, the role's cwd


def test_the_topology_names_both_files_relative_to_itself(tmp_path, key_files):
    path = _topology(tmp_path, proxy=", api_key_file: front.key", engine=", api_key_file: engine.key")
    topology = load_topology(path)
    assert topology.proxy.api_key_file == tmp_path / "front.key"
    assert topology.engine.api_key_file == tmp_path / "engine.key"
    plan = make_launch_plan(topology, Role.DECODE)  # one role of a multi-host deployment: the shared file
    (decode,) = plan.commands
    assert decode.secret_env == (("VLLM_API_KEY", tmp_path / "engine.key"),)
    proxy = make_launch_plan(topology, Role.PROXY).command("proxy").argv
    assert proxy[proxy.index("--engine-key-file") + 1] == str(tmp_path / "engine.key")


def test_engine_key_alone_guards_the_engines_and_says_the_front_door_is_open(tmp_path, key_files):
    result = _invoke("--topology", str(_topology(tmp_path, engine=", api_key_file: engine.key")))
    assert result.exit_code == 0, result.output
    assert "access: open front door (no --api-key-file)" in result.stdout
    assert f"the engines answer only the proxy (VLLM_API_KEY from {tmp_path / 'engine.key'}" in result.stdout


@pytest.mark.parametrize("args,expected", [
    (["--role", "decode"], "a launch of one role cannot generate the key every host must share; accepted: engine: "
                           "{api_key_file: FILE}"),
    (["--role", "single"], "--role single with an API key file: one plain server has no proxy"),
    (["--router", "vllm-router"], "--router vllm-router with an API key file: vllm-router 0.1.17 asks clients for "
                                  "no key"),
], ids=["one-role-without-engine-key", "single", "vllm-router"])
def test_refusals_are_one_line_exit_2(tmp_path, key_files, args, expected):
    result = _invoke("--topology", str(_topology(tmp_path, proxy=", api_key_file: front.key")), *args)
    assert result.exit_code == 2 and expected in result.output and len(result.output.strip().splitlines()) == 1


def test_a_key_in_the_topology_or_on_vllms_command_line_is_refused_without_showing_it(tmp_path):
    result = _invoke("--topology", str(_topology(tmp_path, env=", env: {VLLM_API_KEY: sk-topsecret-1234567}")))
    assert result.exit_code == 2 and "prefill[0]: env VLLM_API_KEY" in result.output
    result = _invoke("--", "--api-key=sk-topsecret-1234567")
    assert result.exit_code == 2 and "vLLM flag --api-key: launch sets --api-key itself" in result.output
    for args in (["--", "--api-key", "sk-topsecret-1234567"], ["--vllm-arg=--api_key=sk-topsecret-1234567"]):
        result = _invoke(*args)
        assert result.exit_code == 2 and "--api" in result.output
    assert "topsecret" not in result.output


@pytest.mark.parametrize("content,expected", [
    (None, "cannot read it (No such file or directory)"),
    ("", "shorter than 16 characters"),
    ("short-secret\n", "shorter than 16 characters"),
    ("two-lines-of-a-secret\nsecond-line-secret\n", "more than one line"),
    ("a secret with spaces in it\n", "spaces or control characters"),
    ("secret-with-ümlaut-0123456789\n", "not ASCII text"),
], ids=["missing", "empty", "short", "two-lines", "spaces", "not-ascii"])
def test_a_bad_key_file_is_named_and_its_content_is_not(tmp_path, content, expected):
    path = tmp_path / "front.key"
    if content is not None:
        path.write_text(content)
    with pytest.raises(InputError) as info:
        keys.read_key(path, what="--api-key-file")
    message = str(info.value)
    assert message.startswith(f"--api-key-file {path}: ") and expected in message and "\n" not in message
    assert "secret" not in message.replace(str(path), "")


def test_a_good_key_file_and_a_generated_one(tmp_path):
    (tmp_path / "k").write_text(FRONT_KEY + "\n")
    assert keys.read_key(tmp_path / "k", what="k") == FRONT_KEY
    keys.write_new_key(tmp_path / "new.key")
    assert stat.S_IMODE((tmp_path / "new.key").stat().st_mode) == 0o600
    assert len(keys.read_key(tmp_path / "new.key", what="k")) == 43  # 32 random bytes, URL-safe base64
    with pytest.raises(FileExistsError):
        keys.write_new_key(tmp_path / "new.key")


def test_preflight_reads_the_key_files_this_host_needs(tmp_path, key_files):
    path = _topology(tmp_path, proxy=", api_key_file: missing.key", engine=", api_key_file: engine.key")
    topology = load_topology(path)
    ok = dict(is_module_available=lambda _: True, is_port_free=lambda *_: True)
    preflight(make_launch_plan(topology, Role.DECODE), **ok)  # the decode host never reads the front key
    with pytest.raises(InputError, match=r"^--api-key-file .*missing.key: cannot read it"):
        preflight(make_launch_plan(topology, Role.PROXY), **ok)


def test_cli_passes_the_key_file_on(monkeypatch, tmp_path):
    seen = {}

    def fake_prepare(request: LaunchRequest):
        seen["request"] = request
        return prepare_launch(LaunchRequest(role=Role.ALL, is_dry_run=True))

    monkeypatch.setattr("hybridserve.cli.launch.prepare_launch", fake_prepare)
    result = _invoke("--api-key-file", str(tmp_path / "front.key"))
    assert result.exit_code == 0, result.output
    assert seen["request"].api_key_file == tmp_path / "front.key"


def test_child_env_reads_the_secret_from_the_run_folder(tmp_path):
    (tmp_path / "engine.key").write_text(ENGINE_KEY + "\n")
    command = RoleCommand(name="decode-0", role=Role.DECODE, argv=("true",), env=(("A", "1"),), host="127.0.0.1",
                          port=1, secret_env=(("VLLM_API_KEY", Path("engine.key")),))
    env = child_env(command, tmp_path)
    assert env["VLLM_API_KEY"] == ENGINE_KEY and env["A"] == "1"


# A role that answers /health and writes whether its VLLM_API_KEY is the run folder's engine.key.
ENGINE = """
import http.server, os, pathlib, sys
same = os.environ.get("VLLM_API_KEY") == pathlib.Path("engine.key").read_text().strip()
pathlib.Path("seen").write_text(f"{same} {oct(os.stat('engine.key').st_mode & 0o777)}")
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_a_generated_engine_key_is_written_0600_and_given_to_the_engines(tmp_path):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = RoleCommand(name="prefill-0", role=Role.PREFILL, argv=(sys.executable, "-c", ENGINE, str(port)), env=(),
                          host="127.0.0.1", port=port, secret_env=(("VLLM_API_KEY", keys.GENERATED_ENGINE_KEY),))
    plan = types.SimpleNamespace(commands=(command,), engine_key_file=keys.GENERATED_ENGINE_KEY)
    with started(plan, tmp_path / "run", timeout_s=60):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as reply:
            assert reply.status == 200
    assert (tmp_path / "run" / "seen").read_text() == "True 0o600"
    key = (tmp_path / "run" / "engine.key").read_text().strip()
    saved = (tmp_path / "run" / "plan.json").read_text()
    assert key not in saved and json.loads(saved)[0]["secret_env"] == {"VLLM_API_KEY": "engine.key"}
    assert os.environ.get("VLLM_API_KEY") != key
