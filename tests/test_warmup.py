"""Issue 51, point 1: launch warms each engine with a burst once it is healthy, before it counts as serving, and a
restarted engine warms the same way while the proxy keeps client requests off it (no vLLM here: small HTTP servers
that answer /health and /v1/completions)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from _ports import free_port

from hybridserve.cli.app import app
from hybridserve.core.common.errors import CouldNotRunError
from hybridserve.core.common.warm_state import WARM, WARM_FILE, WARMING, read_warm_state, write_warm_state
from hybridserve.core.launch.launch_plan import Role, RoleCommand
from hybridserve.core.launch.topology import Device, TINY_MODEL_DIR
from hybridserve.core.launch.warmup import MAX_TOKENS, PROMPT_TOKENS, WarmupBurst, warmup_burst
from hybridserve.core.proxy.health_watch import EndpointHealth
from hybridserve.core.supervise.guard import Guard
from hybridserve.core.supervise.health import health_answer
from hybridserve.core.supervise.process import stop_roles
from hybridserve.core.supervise.restart import RestartLimits
from hybridserve.core.supervise.role_watch import RoleWatch, read_events
from hybridserve.core.supervise.runner import StartedRoles
from hybridserve.core.supervise.warm_send import warm_up
from hybridserve.core.supervise.warming import HEALTHY, Warmer

runner = CliRunner()

# /health 200 (and /v1/models: max_model_len `context`, or empty); POST /v1/completions answers `status` after `delay_s` and appends each body (and its Authorization
# header) to `record` as one JSON line; exits after `live_s` seconds (0: never)
SERVER = """
import http.server, json, sys, threading, time, os
port, status, delay_s, record, live_s = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4], float(sys.argv[5])
context = int(sys.argv[6])  # /v1/models' max_model_len; 0: an empty answer
if live_s:
    threading.Timer(live_s, lambda: os._exit(0)).start()
class Engine(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"data": [{"max_model_len": context}]}).encode() if self.path == "/v1/models" and context else b""
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with open(record, "a") as out:
            out.write(json.dumps({"prompt_tokens": len(body["prompt"]), "max_tokens": body["max_tokens"],
                                  "auth": self.headers.get("Authorization"), "t": time.time()}) + "\\n")
        time.sleep(delay_s)
        answer = json.dumps({"choices": [{"text": "x"}]}).encode()
        self.send_response(status); self.send_header("Content-Length", str(len(answer))); self.end_headers()
        self.wfile.write(answer)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", port), Engine).serve_forever()
"""
BURST = WarmupBurst(prompt_tokens=(16, 300, 1200), max_tokens=4, reason="test")


@pytest.mark.parametrize("device, asked, context, expected", [
    pytest.param(Device.CUDA, None, None, PROMPT_TOKENS, id="cuda-default-on-every-length"),
    pytest.param(Device.CUDA, None, 8192, (16, 256, 1024, 3000, 5000), id="cuda-capped-at-the-context"),
    pytest.param(Device.CUDA, False, None, None, id="cuda-no-warmup"),
    pytest.param(Device.CPU, None, 2048, None, id="cpu-default-off"),
    pytest.param(Device.CPU, True, 2048, (16, 256, 1024), id="cpu-asked"),
    pytest.param(Device.CPU, True, 100, (42, 84), id="context-too-short-for-two-lengths"),
])
def test_the_burst_is_several_prompts_at_once_up_to_the_context(device, asked, context, expected):
    burst = warmup_burst(device, asked, max_context_tokens=context)
    assert (burst.prompt_tokens if burst else None) == expected
    if burst is not None:
        assert burst.max_tokens == MAX_TOKENS and burst.num_requests == len(expected) >= 2
        assert all(n + MAX_TOKENS <= (context or 10**9) for n in burst.prompt_tokens)


@pytest.fixture()
def no_gpu_here(monkeypatch):
    monkeypatch.setattr("hybridserve.core.launch.machine.gpu_memory_bytes", lambda gpu=0: None)


def _dry_run(*args: str) -> dict:
    result = runner.invoke(app, ["launch", "--role", "all", "--dry-run", "--json", *args])
    assert result.exit_code == 0, result.output
    return {c["name"]: c for c in json.loads(result.stdout)["commands"]}


def test_the_cuda_dry_run_names_each_engines_warmup_and_the_proxy_reads_the_warm_file(no_gpu_here):
    commands = _dry_run("--device", "cuda")
    for name in ("prefill-0", "decode-0"):
        assert commands[name]["warmup"]["prompt_tokens"] == [16, 256, 1024, 3000]  # the tiny model's 4,096 context
        assert "CUDA's default" in commands[name]["warmup"]["reason"]
    argv = commands["proxy"]["argv"]
    assert argv[argv.index("--warm-file") + 1] == WARM_FILE
    text = runner.invoke(app, ["launch", "--role", "all", "--dry-run", "--device", "cuda"]).stdout
    assert text.count("# warm-up: 4 requests at once (prompts of 16, 256, 1,024, 3,000 tokens") == 2


@pytest.mark.parametrize("args", [pytest.param(("--device", "cuda", "--no-warmup"), id="cuda-no-warmup"),
                                  pytest.param(("--device", "cpu"), id="cpu-default")])
def test_without_a_warmup_no_burst_and_no_warm_file(no_gpu_here, args):
    commands = _dry_run(*args)
    assert commands["prefill-0"]["warmup"] is None and commands["decode-0"]["warmup"] is None
    assert "--warm-file" not in commands["proxy"]["argv"]


def test_a_topology_file_turns_it_on_and_the_flag_wins_over_it(no_gpu_here, tmp_path):
    topology = tmp_path / "t.yaml"
    topology.write_text("device: cpu\nengine: {warmup: true}\nprefill: [{port: 8100, side_channel_port: 8150}]\n"
                        "decode: [{port: 8200, side_channel_port: 8250}]\nproxy: {port: 8000}\n")
    assert _dry_run("--topology", str(topology))["decode-0"]["warmup"]["prompt_tokens"] == [16, 256, 1024]
    assert _dry_run("--topology", str(topology), "--no-warmup")["decode-0"]["warmup"] is None


def test_warm_state_keeps_other_engines_and_reads_nothing_from_no_file(tmp_path):
    path = tmp_path / WARM_FILE
    assert read_warm_state(path) == {}
    write_warm_state(path, "http://a", WARMING)
    write_warm_state(path, "http://b", WARM)
    write_warm_state(path, "http://a", WARM)
    assert read_warm_state(path) == {"http://a": WARM, "http://b": WARM}
    path.write_text("not json")
    assert read_warm_state(path) == {}


def test_the_proxy_keeps_a_server_down_while_launch_warms_it(tmp_path):
    warm_file, url = tmp_path / WARM_FILE, "http://d1:8200"
    health = EndpointHealth((url,), warm_file=warm_file)

    async def probe() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(lambda _r: httpx.Response(200))) as client:
            await health.probe(client)

    asyncio.run(probe())
    assert health.is_up(url)  # no file: /health alone decides
    write_warm_state(warm_file, url, WARMING)
    asyncio.run(probe())
    assert not health.is_up(url) and "warming up" in health.report()[url]["why"]
    write_warm_state(warm_file, url, WARM)
    asyncio.run(probe())
    assert health.is_up(url)


def _engine(tmp_path: Path, name: str, *, status: int = 200, delay_s: float = 0.0, live_s: float = 0.0,
            key: str | None = None, context: int = 0) -> tuple[RoleCommand, Path]:
    port, record = free_port(), tmp_path / f"{name}.requests"
    secret = ()
    if key is not None:
        (tmp_path / "engine.key").write_text(key + "\n")
        secret = (("VLLM_API_KEY", Path("engine.key")),)
    argv = (sys.executable, "-c", SERVER, str(port), str(status), str(delay_s), str(record), str(live_s), str(context))
    return RoleCommand(name=name, role=Role.DECODE, argv=argv, env=(), host="127.0.0.1", port=port,
                       secret_env=secret), record


def _started(tmp_path: Path, *commands: RoleCommand) -> StartedRoles:
    roles = StartedRoles(tmp_path, Guard())
    for command in commands:
        roles.start(command)
    deadline = time.monotonic() + 30
    while not all(health_answer(r.command.url, timeout_s=0.3) == 200 for r in roles) and time.monotonic() < deadline:
        time.sleep(0.05)
    return roles


def _requests(record: Path) -> list[dict]:
    return [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []


def test_the_warmer_sends_every_prompt_at_once_with_the_engine_key_and_marks_it_warm(tmp_path):
    command, record = _engine(tmp_path, "decode-0", delay_s=0.3, key="k" * 20)
    roles = _started(tmp_path, command)
    heard: list[tuple[str, str]] = []
    warmer = Warmer({"decode-0": BURST}, tmp_path, model=TINY_MODEL_DIR, model_name="tiny-qwen3.5", timeout_s=30,
                    on_progress=lambda name, phase: heard.append((name, phase)))
    try:
        warmer.heard("decode-0", "serving")
        warmer.warm_all(roles)
    finally:
        roles.guard.release()
        stop_roles(roles, grace_s=2)
    sent = _requests(record)
    assert sorted(r["prompt_tokens"] for r in sent) == [16, 300, 1200] and {r["max_tokens"] for r in sent} == {4}
    assert {r["auth"] for r in sent} == {"Bearer " + "k" * 20}
    assert max(r["t"] for r in sent) - min(r["t"] for r in sent) < 0.3  # all at once, not one after another
    assert 0.3 <= warmer.seconds["decode-0"] < 5
    assert [p for _, p in heard][0] == HEALTHY and [p for _, p in heard][-1] == "serving"
    assert any(p.startswith("warm-up done in") for _, p in heard)
    assert read_warm_state(tmp_path / WARM_FILE) == {command.url: WARM}


def test_a_failed_warmup_request_names_the_role_and_what_failed(tmp_path):
    command, _ = _engine(tmp_path, "prefill-0", status=500)
    roles = _started(tmp_path, command)
    try:
        with pytest.raises(CouldNotRunError, match=r"prefill-0: its warm-up request of \d+ prompt tokens failed "
                                                    r"\(HTTP 500\)"):
            warm_up(command, BURST, model_name="m", vocab_size=1024, key=None, timeout_s=10)
    finally:
        roles.guard.release()
        stop_roles(roles, grace_s=2)


def test_a_restarted_engine_warms_before_it_serves_and_is_marked_warming_from_its_failure(tmp_path):
    command, record = _engine(tmp_path, "decode-0", delay_s=0.5, live_s=1.5)
    roles = _started(tmp_path, command)
    roles.warmer = Warmer({"decode-0": BURST}, tmp_path, model=TINY_MODEL_DIR, model_name="tiny-qwen3.5",
                          timeout_s=30)
    limits = RestartLimits(max_restarts=1, first_backoff_s=0.1, max_backoff_s=0.2, check_every_s=0.2,
                           check_timeout_s=1.0)
    watch = RoleWatch(roles, limits=limits, start_timeout_s=20)
    states: list[str | None] = []
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any(e["event"] == "serving" for e in read_events(tmp_path)):
            watch.tick()
            states.append(read_warm_state(tmp_path / WARM_FILE).get(command.url))
            time.sleep(0.05)
    finally:
        watch.checks.shutdown(wait=False), watch.warm_ups.shutdown(wait=False)
        roles.guard.release()
        stop_roles(roles, grace_s=2)
    events = [e["event"] for e in read_events(tmp_path)]
    assert events == ["failed", "restarting", "warming", "serving"], events
    serving = read_events(tmp_path)[-1]
    assert serving["warm_s"] >= 0.5  # the burst's answers took 0.5 s
    assert WARMING in states and states[-1] == WARM  # warming from the failure until the burst was done
    assert states.index(WARMING) < len(states) - 1
    assert sorted(r["prompt_tokens"] for r in _requests(record)) == [16, 300, 1200]  # only the restart warmed


def test_prompts_past_the_context_the_server_resolved_are_left_out(tmp_path):
    """`--max-model-len auto` is resolved by vLLM at start: the burst asks /v1/models and keeps what fits."""
    command, record = _engine(tmp_path, "decode-0", context=1000)
    roles = _started(tmp_path, command)
    try:
        warm_up(command, BURST, model_name="m", vocab_size=1024, key=None, timeout_s=10)
    finally:
        roles.guard.release()
        stop_roles(roles, grace_s=2)
    assert sorted(r["prompt_tokens"] for r in _requests(record)) == [16, 300]  # 1,200 + 4 out > 1,000
