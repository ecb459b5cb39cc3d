"""The chaos bench's counts (core/chaos/tally.py) from made-up records: which failures are excused, what a kill's
recovery is, when a KV curve is back at idle. No server."""

from __future__ import annotations

from hybridserve.core.chaos.bounded_load import Sent
from hybridserve.core.chaos.session import ChaosSpec, parse_phase, report_wait_s, topology_yaml
from hybridserve.core.chaos.tally import Kill, held_seconds, released_seconds, tally, verdicts
from hybridserve.core.deployments.client import Completion
from hybridserve.core.validate.thresholds import Thresholds


def _sent(rid, start, end, *, ok=True, first=None, stream=False, role=None, refused=False, answer=None,
          prompt=0):  # noqa: ANN001
    return Sent(rid=rid, start=start, end=end, first_byte=first, status=200 if ok else 502, is_stream=stream,
                is_ok=ok, error_role=role, is_refused=refused, answer=answer, prompt_index=prompt)


def _answer(*tokens: str, gap: float = 3.0) -> Completion:
    """Greedy tokens, each chosen with logprob -0.1 over a runner-up `gap` below."""
    return Completion(text="".join(tokens), tokens=tokens, logprobs=(-0.1,) * len(tokens),
                      top2_gaps=(gap,) * len(tokens),
                      top=tuple({t: -0.1, "other": -0.1 - gap} for t in tokens))


def test_a_begun_stream_is_excused_and_a_request_not_yet_begun_is_not():
    kill = Kill(t=10.0, roles=("decode-0",), alive_decodes=("decode-1",))
    sent = [_sent("a", 1, 2), _sent("b", 8, 11, ok=False, first=9.0, stream=True, role="decode"),
            _sent("c", 9.5, 12, ok=False, role="decode"), _sent("d", 10.5, 12.5), _sent("e", 11, 13)]
    restarts = [{"t": 40.0, "role": "decode-0", "event": "serving"}]
    before, row = tally(sent, [kill], [{"event": "retry", "req": "d"}], restarts)
    assert (before.kill, before.sent, before.ok, row.kill) == ("before", 1, 1, "1 decode-0")
    assert (row.sent, row.ok, row.failed, row.unexcused, row.retried, row.fell_back) == (4, 2, 2, 1, 1, 0)
    assert row.first_ok_s == 2.5 and row.restart_s == 30.0
    assert row.goals_met == ("no unexcused failure: NO", "no wrong answer: yes", "all served with a decode alive: NO",
                             "first ok within restart + 5 s: yes")


def test_requests_lost_with_a_killed_proxy_and_refused_ones_are_apart_and_recovery_is_judged():
    kill = Kill(t=10.0, roles=("proxy",), alive_decodes=("decode-0",))
    sent = [_sent("a", 9, 10.1, ok=False, role="proxy"), _sent("b", 10.2, 10.3, ok=False, role="proxy", refused=True),
            _sent("c", 12, 19)]
    row = tally(sent, [kill], [{"event": "fallback", "req": "c"}], [{"t": 12.5, "role": "proxy",
                                                                     "event": "serving"}])[1]
    assert (row.lost, row.refused, row.failed, row.unexcused, row.fell_back) == (1, 1, 1, 0, 1)
    assert row.first_ok_s == 9.0 and row.restart_s == 2.5
    assert "first ok within restart + 5 s: NO" in row.goals_met and not row.is_met  # 9 s > 2.5 + 5
    assert not any(g.startswith("all served with a decode alive") for g in row.goals_met)  # decode goal only


def test_a_role_that_never_came_back_has_no_restart_time_and_fails_recovery():
    kill = Kill(t=10.0, roles=("prefill-0",), alive_decodes=("decode-0",))
    row = tally([_sent("a", 11, 12)], [kill], [], [])[1]
    assert row.restart_s is None and not row.is_met


def test_every_ok_answer_is_judged_against_the_reference_and_a_wrong_one_fails_its_row():
    """Issue 39's wrong 200: one token of the reference's sixteen; a stream with another token at a wide gap."""
    refs = [_answer(*[" S01"] * 16), _answer(" a", " b", " c")]
    kill = Kill(t=10.0, roles=("decode-0",), alive_decodes=("decode-1",))
    sent = [_sent("a", 1, 2, answer=_answer(*[" S01"] * 16)), _sent("b", 11, 12, answer=_answer(" S01")),
            _sent("c", 11, 13, stream=True, answer=_answer(" a", " x", " c"), prompt=1),
            _sent("d", 11, 14, answer=_answer(" a", " b", " c"), prompt=1), _sent("e", 12, 15, ok=False, role="decode"),
            _sent("f", 12, 16)]  # no logprobs came: not judged
    judged = verdicts(sent, refs, Thresholds())
    assert set(judged) == {"a", "b", "c", "d"} and judged["a"] is None and judged["d"] is None
    assert "diverged at token 1" in judged["b"] and "diverged at token 1" in judged["c"]
    before, row = tally(sent, [kill], [], [{"t": 30.0, "role": "decode-0", "event": "serving"}], judged)
    assert (before.judged, before.wrong, row.judged, row.wrong) == (1, 0, 3, 2)
    assert "no wrong answer: NO" in row.goals_met and not row.is_met and before.is_met


def test_kv_usage_held_until_it_is_back_at_idle_and_stays():
    samples = [(9.0, "prefill-0", 0.0), (10.5, "prefill-0", 0.02), (20.0, "prefill-0", 0.0),
               (21.0, "prefill-0", 0.01), (35.0, "prefill-0", 0.0), (36.0, "prefill-0", 0.0), (36.5, "decode-0", 0.3)]
    assert held_seconds(samples, "prefill-0", since=10.0) == 25.0
    assert held_seconds(samples[:4], "prefill-0", since=10.0) is None


def test_releases_count_after_a_prefill_kill_until_the_next_kill():
    kills = [Kill(t=10.0, roles=("decode-0",), alive_decodes=("decode-1",)),
             Kill(t=50.0, roles=("prefill-0",), alive_decodes=("decode-0", "decode-1"), phase=2),
             Kill(t=90.0, roles=("proxy",), alive_decodes=("decode-0", "decode-1"), phase=3)]
    events = [{"t": 12.0, "event": "peer_released"}, {"t": 52.1, "event": "peer_released"},
              {"t": 53.0, "event": "retry"}, {"t": 52.6, "event": "peer_released"},
              {"t": 95.0, "event": "peer_released"}]
    assert released_seconds(kills, events, "peer_released") == {"1 decode-0": [2.0], "2 prefill-0": [2.1, 2.6],
                                                                "3 proxy": [5.0]}
    assert released_seconds([], events, "peer_released") == {}


def test_a_phase_and_the_topology_name_every_instance():
    assert parse_phase("decode-0,decode-1@5") == ((0.0, "decode-0"), (5.0, "decode-1"))
    text = topology_yaml(ChaosSpec(kills=(), num_decodes=2, base_port=19600, router="vllm-router"))
    assert '"port": 19800' in text and '"port": 19801' in text and '"kind": "vllm-router"' in text
    assert '"kv_lease_s": 30' in text and "tiny-qwen3.5-recall" in text  # judged answers: the trained model


def test_a_run_that_stops_in_a_phase_reports_why_and_keeps_the_logs(tmp_path, monkeypatch):
    """No server: launch is a sleeping process whose roles never answer, so the first phase's wait for every role
    gives up; the result says so (it is not lost in a traceback) and the run folder's logs are kept."""
    import subprocess
    import sys

    from hybridserve.core.chaos import session as run

    def fake_launch(tmp, spec):  # noqa: ANN001, ANN202
        run_dir = tmp / "runs" / "20261204-000000-all"
        run_dir.mkdir(parents=True)
        (run_dir / "prefill-0.log").write_text("GET /health 200\nValueError: Free memory on device cuda:0\n")
        (run_dir / "restarts.jsonl").write_text('{"event": "failed", "role": "prefill-0"}\n')
        (tmp / "launch.err").write_text("failed: prefill-0 exited with code 1\n")
        launcher = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
        return launcher, run_dir, {"prefill-0": "http://127.0.0.1:9", "proxy": "http://127.0.0.1:9"}

    monkeypatch.setattr(run, "_launch", fake_launch)
    monkeypatch.setattr(run, "_model_name", lambda spec: "m")  # (the load's requests are refused: port 9)
    spec = ChaosSpec(kills=(parse_phase("prefill-0"),), num_decodes=1, start_timeout_s=1.0,
                     keep_logs=tmp_path / "logs")
    result = run.run_chaos(spec)
    assert result.error == ("RuntimeError: roles not healthy after 1 s: {'prefill-0': None, 'proxy': None}")
    assert result.launch_exit == -15 and result.kills == [] and result.restarts[0]["role"] == "prefill-0"
    kept = {p.name: p.read_text() for p in (tmp_path / "logs").iterdir()}
    assert set(kept) == {"prefill-0.log", "restarts.jsonl", "launch.err"}
    assert kept["prefill-0.log"] == "ValueError: Free memory on device cuda:0\n"  # the /health lines left out


def test_a_failed_request_keeps_what_the_client_was_told_and_the_proxy_lines_naming_it(tmp_path):
    import json

    import httpx

    from hybridserve.core.chaos.bounded_load import Load
    from hybridserve.core.chaos.session import _lines_naming

    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if not body["stream"]:
            told = {"message": "decode http://d:1 failed: ReadError", "role": "decode"}
            return httpx.Response(502, json={"error": told})
        if body["prompt"].startswith("cut"):
            return httpx.Response(200, text='data: {"choices": [{"text": "a"}]}\n\n')
        return httpx.Response(200, text='data: {"choices": [{"text": "a"}]}\n\n'
                                        'data: {"error": {"message": "prefill failed: 500", "role": "prefill"}}\n\n')

    load = Load("http://front", "m", ["p", "s", "cut"])
    with httpx.Client(transport=httpx.MockTransport(answer)) as client:
        plain = load.send(client, is_stream=False, prompt_index=0)
        stream = load.send(client, is_stream=True, prompt_index=1)
        cut = load.send(client, is_stream=True, prompt_index=2)
    assert (plain.is_ok, plain.error_role, plain.error) == (False, "decode", "decode http://d:1 failed: ReadError")
    assert (stream.is_ok, stream.error_role, stream.error) == (False, "prefill", "prefill failed: 500")
    assert stream.first_byte is not None
    assert (cut.is_ok, cut.error_role, cut.error) == (False, "proxy", "the stream ended without [DONE]")
    assert plain.answer is None and stream.answer is None  # failed: nothing to judge

    log = tmp_path / "proxy.log"
    log.write_text("hybridserve proxy: request r1: decode u failed: X\nother line\n"
                   "hybridserve proxy: request r1 served by prefill u alone\nrequest r2: prefill u failed: Y\n")
    assert _lines_naming({"r1", "r3"}, log) == {"r1": ["hybridserve proxy: request r1: decode u failed: X",
                                                      "hybridserve proxy: request r1 served by prefill u alone"]}
    assert _lines_naming({"r1"}, tmp_path / "absent.log") == {}


def test_the_load_keeps_each_ok_answers_tokens_and_logprobs_streamed_or_not():
    import json

    import httpx

    from hybridserve.core.chaos.bounded_load import Load

    logprobs = [{"tokens": [" a"], "token_logprobs": [-0.1], "top_logprobs": [{" a": -0.1, " b": -2.0}]},
                {"tokens": [" c"], "token_logprobs": [-0.2], "top_logprobs": [{" c": -0.2, " d": -1.0}]}]

    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        assert body["logprobs"] == 2 and body["prompt"] == "q" and body["ignore_eos"] is True
        if not body["stream"]:
            merged = {k: logprobs[0][k] + logprobs[1][k] for k in logprobs[0]}
            return httpx.Response(200, json={"choices": [{"text": " a c", "logprobs": merged}]})
        events = "".join(f"data: {json.dumps({'choices': [{'text': t, 'logprobs': lp}]})}\n\n"
                         for t, lp in zip((" a", " c"), logprobs))
        return httpx.Response(200, text=events + "data: [DONE]\n\n")

    load = Load("http://front", "m", ["q"])
    with httpx.Client(transport=httpx.MockTransport(answer)) as client:
        plain, stream = (load.send(client, is_stream=s, prompt_index=0) for s in (False, True))
    for sent in (plain, stream):
        assert sent.is_ok and sent.answer.tokens == (" a", " c") and sent.answer.top2_gaps == (1.9, 0.8), sent
        assert sent.answer.text == " a c"


def test_a_burst_is_counted_from_the_timeline_the_logs_and_the_judged_answers(tmp_path):
    """core/chaos/burst.py: decode's queue and how long after prefill's token each READ came, from the timeline; the
    guard's refusals and prefill's expired leases and late reads, from the logs."""
    import json

    from hybridserve.core.chaos.burst import EXPIRED_LOG, LATE_READ_LOG, tally_burst
    from hybridserve.core.vllm_plugin.lease_guard import REFUSED_LOG_PREFIX

    a, b = "a" * 32, "b" * 32
    sent = [_sent(a, 0, 9, answer=_answer(" x", " y")), _sent(b, 0, 12, stream=True, answer=_answer(" x", " z")),
            _sent("c" * 32, 0, 1, ok=False, role="decode")]
    events = [{"t": 0.1, "pid": 1, "event": "hop1_start", "req": a},
              {"t": 0.1, "pid": 1, "event": "hop1_start", "req": b},
              {"t": 0.2, "pid": 2, "event": "arrive", "req": f"cmpl-{a}-0", "role": "prefill"},
              {"t": 0.5, "pid": 2, "event": "first_token", "req": f"cmpl-{a}-0"},
              {"t": 0.6, "pid": 2, "event": "first_token", "req": f"cmpl-{b}-0"},
              {"t": 0.7, "pid": 3, "event": "arrive", "req": f"cmpl-{a}-0-x", "role": "decode"},
              {"t": 0.8, "pid": 3, "event": "arrive", "req": f"cmpl-{b}-0-x", "role": "decode"},
              {"t": 1.0, "pid": 3, "event": "alloc", "req": f"cmpl-{a}-0-x"},
              {"t": 7.8, "pid": 3, "event": "alloc", "req": f"cmpl-{b}-0-x"},
              {"t": 1.2, "pid": 4, "event": "nixl_done", "req": f"cmpl-{a}-0-x"},
              {"t": 8.1, "pid": 4, "event": "nixl_done", "req": f"cmpl-{b}-0-x"}]
    (tmp_path / "timeline.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (tmp_path / "decode-0.log").write_text(f"x\n{REFUSED_LOG_PREFIX} r1: late\n")
    (tmp_path / "prefill-0.log").write_text(f"{EXPIRED_LOG} r1\n{EXPIRED_LOG} r2\n{LATE_READ_LOG} r1\n")
    result = tally_burst(sent, 12.0, [_answer(" x", " y")], Thresholds(), timeline=tmp_path / "timeline.jsonl",
                         run_dir=tmp_path, proxy_url="http://127.0.0.1:9", lease_s=3)
    assert (result.right, result.wrong, result.errors) == (1, 1, 1)
    assert result.decode_wait_s == {"max": 7.0, "p50": 3.65, "count": 2}  # b waited 0.8 -> 7.8 in decode's queue
    assert result.lease_needed_s["max"] == 7.5 and result.num_over_lease == 1  # b's READ 7.5 s after its token
    assert (result.refused, result.expired, result.late_reads) == (1, 2, 1)
    assert result.wrong_answers[0]["rid"] == b and result.proxy_lease == {}  # (no proxy there)


def test_a_stall_probe_asks_as_the_load_asks_so_its_reference_is_compared_id_for_id():
    """lease_burst judges its stall probes against the load's reference answers, which ask for tokens as ids: a
    probe that asked for text was "diverged at token 0" against them (the CPU smoke of --attach, 2026-12-05)."""
    from hybridserve.core.chaos.bounded_load import Load
    from hybridserve.core.chaos.stall import Probe

    load = Load("http://p", "m", [[5, 6, 7]], max_tokens=4, timeout_s=5)
    probe = Probe(model="m", prompt=[5, 6, 7], max_tokens=4, is_token_ids=True)
    reference_keys = {k for k in load.body(0) if k != "stream"}
    assert reference_keys <= set(probe.body()) and probe.body()["return_tokens_as_token_ids"] is True
    assert "return_tokens_as_token_ids" not in Probe(model="m", prompt="a").body()  # issue 39's text client


def test_the_wait_for_launchs_endpoints_covers_one_start_wave_per_engine(tmp_path):  # noqa: ANN001
    """launch's --timeout bounds each wave; three engines on one GPU start in three waves (the H200's cold start of
    2026-12-05 took 166 + 118 + 118 s and outlasted a wait of one --timeout)."""
    topology = tmp_path / "topology.yaml"
    topology.write_text(topology_yaml(ChaosSpec(kills=(), num_decodes=2, device="cuda")))
    assert report_wait_s(topology, 300) == 3 * 300 + 60
    topology.write_text(topology_yaml(ChaosSpec(kills=(), num_decodes=1, device="cuda")))
    assert report_wait_s(topology, 300) == 2 * 300 + 60
    topology.write_text("model: m\nreplicas: []\n")
    assert report_wait_s(topology, 300) == 300 + 60
