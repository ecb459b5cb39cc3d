"""bench without servers: lengths, arrivals, prompts, percentiles, Prometheus deltas, the prediction, the CLI's
refusals and its arguments."""

import json
import random
import statistics

import pytest
from typer.testing import CliRunner

from hybridserve.cli.app import app
from hybridserve.core.bench import client_stats, server_metrics
from hybridserve.core.bench.lengths import LengthDist, parse_length
from hybridserve.core.bench.load import Load, arrival_offsets, make_load
from hybridserve.core.bench.phase import PhaseSpec, ProbeSpec, check_phase
from hybridserve.core.bench.prompts import make_prompts, special_token_ids
from hybridserve.core.bench.stream import RequestRecord, _Timing
from hybridserve.core.common.errors import InputError
from hybridserve.core.common.fault_kind import FaultKind, STATE_CORRUPTION_FAULTS


@pytest.mark.parametrize("text, lo, hi", [("1024", 1024, 1024), ("500:12000", 500, 12000), ("32_768", 32768, 32768),
                                          (" 7:7 ", 7, 7)])
def test_parse_length(text, lo, hi):
    assert parse_length(text, flag="--input-len") == LengthDist(min_tokens=lo, max_tokens=hi)


@pytest.mark.parametrize("text", ["0", "-3", "12:5", "a", "1:2:3", ""])
def test_parse_length_refuses(text):
    with pytest.raises(InputError, match="--input-len"):
        parse_length(text, flag="--input-len")


def test_uniform_lengths_cover_the_range_inclusive_and_repeat_with_the_seed():
    dist = LengthDist(min_tokens=500, max_tokens=503)
    drawn = dist.sample(random.Random(1), 400)
    assert set(drawn) == {500, 501, 502, 503}
    assert drawn == dist.sample(random.Random(1), 400)
    assert LengthDist(min_tokens=9, max_tokens=9).sample(random.Random(0), 3) == (9, 9, 9)


def test_poisson_arrivals_have_the_rate_and_the_seed_repeats_them():
    load = make_load(None, 4.0)
    offsets = arrival_offsets(load, 4000, random.Random(3))
    gaps = [b - a for a, b in zip(offsets, offsets[1:])]
    assert offsets[0] == 0.0 and all(g >= 0 for g in gaps)
    assert statistics.mean(gaps) == pytest.approx(0.25, rel=0.05)  # mean gap 1/rate
    assert statistics.stdev(gaps) == pytest.approx(0.25, rel=0.08)  # exponential: stdev = mean
    assert offsets == arrival_offsets(load, 4000, random.Random(3))
    assert load.max_concurrency is None and not load.is_idle


def test_loads_from_the_command_line():
    assert make_load(None, None) == Load(max_concurrency=1) and make_load(None, None).is_idle
    assert make_load(16, None).name == "concurrency 16"
    assert make_load(4, 2.5).name == "concurrency 4, rate 2.5/s"
    assert arrival_offsets(make_load(16, None), 3, random.Random(0)) == (0.0, 0.0, 0.0)
    for concurrency, rate in ((0, None), (None, 0.0), (None, -1.0)):
        with pytest.raises(InputError):
            make_load(concurrency, rate)


def test_prompts_are_ids_below_the_vocab_without_special_ids_and_differ():
    config = {"vocab_size": 50, "eos_token_id": 3, "text_config": {"image_token_id": 7, "bos_token_id": [1, 2]}}
    excluded = special_token_ids(config)
    assert excluded == {1, 2, 3, 7}
    prompts = make_prompts((300, 300, 5), vocab_size=50, excluded=excluded, rng=random.Random(0))
    assert [len(p) for p in prompts] == [300, 300, 5]
    ids = {t for p in prompts for t in p}
    assert ids <= set(range(50)) - excluded and len(ids) == 46
    assert prompts[0][:8] != prompts[1][:8]  # no shared prefix for a prefix cache to serve


def test_percentiles_interpolate_as_numpy():
    values = [4.0, 1.0, 3.0, 2.0]
    assert client_stats.percentile(values, 50) == 2.5
    assert client_stats.percentile(values, 90) == pytest.approx(3.7)
    assert client_stats.percentile(values, 99) == pytest.approx(3.97)
    assert client_stats.percentile([5.0], 99) == 5.0 and client_stats.percentile([], 50) is None


def _record(start, ttft, e2e, itl, out=4, error=None, asked=4):
    return RequestRecord(input_tokens=10, max_output_tokens=asked, output_tokens=out, start_s=start, ttft_s=ttft,
                         e2e_s=e2e, itl_s=itl, error=error)


def test_summary_pools_itl_and_counts_throughput_over_the_wall():
    records = [_record(0.0, 0.1, 1.0, (0.2, 0.3, 0.4)), _record(0.5, 0.3, 1.5, (0.1,), out=2),
               _record(0.2, None, None, (), out=0, error="HTTP 500: boom")]
    summary = client_stats.summarize(records)
    assert (summary.num_sent, summary.num_ok, summary.num_failed, summary.num_short) == (3, 2, 1, 1)
    assert summary.first_error == "HTTP 500: boom"
    assert summary.wall_s == 2.0  # first send 0.0 to the last answer 0.5 + 1.5
    assert summary.ttft_s.p50 == pytest.approx(0.2) and summary.itl_s.p50 == pytest.approx(0.25)
    assert summary.request_throughput == 1.0 and summary.output_throughput == 3.0


def test_stream_timing_counts_tokens_by_usage_even_with_empty_text():
    timing = _Timing(0.0)
    chunks = [({"choices": [{"text": "a"}], "usage": {"completion_tokens": 1}}, 1.0),
              ({"choices": [{"text": ""}], "usage": {"completion_tokens": 2}}, 1.5),  # a partial UTF-8 piece
              ({"choices": [{"text": "bc"}], "usage": {"completion_tokens": 4}}, 2.5),
              ({"choices": [], "usage": {"completion_tokens": 4}}, 2.6)]  # the final usage chunk
    for payload, now in chunks:
        timing.feed(payload, now)
    assert timing.times == [1.0, 1.5, 2.5] and timing.num_tokens == 4 and timing.error is None
    timing.feed({"error": {"message": "decode server failed"}}, 3.0)
    assert timing.error == "decode server failed"


METRICS_BEFORE = """# HELP vllm:nixl_xfer_time_seconds x
vllm:nixl_xfer_time_seconds_bucket{engine="0",le="0.001",model_name="m"} 1.0
vllm:nixl_xfer_time_seconds_bucket{engine="0",le="0.005",model_name="m"} 2.0
vllm:nixl_xfer_time_seconds_bucket{engine="0",le="0.01",model_name="m"} 2.0
vllm:nixl_xfer_time_seconds_bucket{engine="0",le="+Inf",model_name="m"} 2.0
vllm:nixl_xfer_time_seconds_count{engine="0",model_name="m"} 2.0
vllm:nixl_xfer_time_seconds_sum{engine="0",model_name="m"} 0.004
vllm:nixl_num_descriptors_count{engine="0",model_name="m"} 2.0
vllm:nixl_num_descriptors_sum{engine="0",model_name="m"} 30.0
vllm:nixl_post_time_seconds_count{engine="0",model_name="m"} 2.0
vllm:nixl_post_time_seconds_sum{engine="0",model_name="m"} 0.0
vllm:nixl_bytes_transferred_count{engine="0",model_name="m"} 2.0
vllm:nixl_bytes_transferred_sum{engine="0",model_name="m"} 0.0
vllm:nixl_num_failed_transfers_total{engine="0",model_name="m"} 0.0
"""
METRICS_AFTER = """vllm:nixl_xfer_time_seconds_bucket{engine="0",le="0.001",model_name="m"} 1.0
vllm:nixl_xfer_time_seconds_bucket{engine="0",le="0.005",model_name="m"} 4.0
vllm:nixl_xfer_time_seconds_bucket{engine="0",le="0.01",model_name="m"} 6.0
vllm:nixl_xfer_time_seconds_bucket{engine="0",le="+Inf",model_name="m"} 6.0
vllm:nixl_xfer_time_seconds_count{engine="0",model_name="m"} 6.0
vllm:nixl_xfer_time_seconds_sum{engine="0",model_name="m"} 0.032
vllm:nixl_post_time_seconds_count{engine="0",model_name="m"} 6.0
vllm:nixl_post_time_seconds_sum{engine="0",model_name="m"} 0.006
vllm:nixl_bytes_transferred_count{engine="0",model_name="m"} 6.0
vllm:nixl_bytes_transferred_sum{engine="0",model_name="m"} 4e6
vllm:nixl_num_descriptors_count{engine="0",model_name="m"} 6.0
vllm:nixl_num_descriptors_sum{engine="0",model_name="m"} 110.0
vllm:nixl_num_failed_transfers_total{engine="0",model_name="m"} 1.0
vllm:nixl_num_kv_expired_reqs_total{engine="0",model_name="m"} 2.0
"""


def test_nixl_stats_are_the_phase_difference():
    before = server_metrics.parse_prometheus(METRICS_BEFORE)
    after = server_metrics.parse_prometheus(METRICS_AFTER)
    stats = server_metrics.nixl_stats(server_metrics.delta(after, before))
    assert stats.num_transfers == 4
    assert stats.mean_xfer_s == pytest.approx(0.007)  # (0.032 - 0.004) / 4
    assert stats.mean_descriptors == pytest.approx(20.0)  # (110 - 30) / 4
    assert stats.mean_post_s == pytest.approx(0.0015) and stats.mean_bytes == pytest.approx(1e6)
    assert (stats.num_failed_transfers, stats.num_kv_expired) == (1, 2)
    # the 4 new transfers: 2 in (1, 5] ms, 2 in (5, 10] ms: the median rank 2 ends the first bucket
    assert stats.p50_xfer_s == pytest.approx(0.005)


def test_series_of_several_engines_are_summed_and_no_nixl_is_none():
    text = 'a_count{engine="0"} 2\na_count{engine="1"} 3\n'
    assert server_metrics.parse_prometheus(text) == {("a_count", None): 5.0}
    assert server_metrics.nixl_stats(server_metrics.parse_prometheus("vllm:num_requests_running 0\n")) is None


def test_engine_timing_is_the_phase_difference_of_vllms_request_histograms():
    from hybridserve.core.bench.engine_timing import engine_timing

    before = server_metrics.parse_prometheus(
        'vllm:request_prefill_time_seconds_count{engine="0",model_name="m"} 3.0\n'
        'vllm:request_prefill_time_seconds_sum{engine="0",model_name="m"} 0.3\n'
        'vllm:request_queue_time_seconds_count{engine="0",model_name="m"} 3.0\n'
        'vllm:request_queue_time_seconds_sum{engine="0",model_name="m"} 0.003\n'
        'vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 3.0\n'
        'vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 0.33\n')
    after = server_metrics.parse_prometheus(
        'vllm:request_prefill_time_seconds_count{engine="0",model_name="m"} 7.0\n'
        'vllm:request_prefill_time_seconds_sum{engine="0",model_name="m"} 0.78\n'
        'vllm:request_queue_time_seconds_count{engine="0",model_name="m"} 7.0\n'
        'vllm:request_queue_time_seconds_sum{engine="0",model_name="m"} 0.007\n'
        'vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 8.0\n'
        'vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 0.93\n')
    timing = engine_timing(server_metrics.delta(after, before))
    assert timing.num_requests == 4
    assert timing.mean_prefill_s == pytest.approx(0.12)  # (0.78 - 0.3) / 4
    assert timing.mean_queue_s == pytest.approx(0.001)
    assert timing.mean_server_ttft_s == pytest.approx(0.12)  # (0.93 - 0.33) / 5: one more at its first token
    assert engine_timing(server_metrics.parse_prometheus("vllm:num_requests_running 0\n")) is None


@pytest.mark.parametrize("q, expected", [(0.25, 0.0025), (0.5, 0.005), (0.75, 0.0075), (1.0, 0.01)])
def test_histogram_quantile_interpolates_inside_the_bucket(q, expected):
    buckets = {0.005: 2.0, 0.01: 4.0, float("inf"): 4.0}  # 2 below 5 ms, 2 in (5, 10] ms
    assert server_metrics.histogram_quantile(q, buckets) == pytest.approx(expected)


def test_phase_checks():
    spec = PhaseSpec(load=Load(max_concurrency=16), num_requests=48, input_len=LengthDist(min_tokens=500,
                     max_tokens=12000), output_len=LengthDist(min_tokens=32, max_tokens=32),
                     probe=ProbeSpec(num_probes=3, input_tokens=32768, output_tokens=16, after_requests=16))
    check_phase(spec, 34816)
    with pytest.raises(InputError, match="max_model_len 32768"):
        check_phase(spec, 32768)  # the probe's 32768 + 16 tokens do not fit
    from dataclasses import replace
    with pytest.raises(InputError, match="--probe-after"):
        check_phase(replace(spec, probe=replace(spec.probe, after_requests=49)), None)
    with pytest.raises(InputError, match="--num-requests"):
        check_phase(replace(spec, num_requests=0), None)


def test_slow_decode_is_a_latency_fault_outside_the_corruption_set():
    assert FaultKind("slow_decode") is FaultKind.SLOW_DECODE and not FaultKind.SLOW_DECODE.is_state_corruption
    assert STATE_CORRUPTION_FAULTS == (FaultKind.EARLY_COMPLETION, FaultKind.ZERO_AFTER_TRANSFER,
                                       FaultKind.STALE_STATE)


def test_prediction_bytes_and_reads_from_the_layout_library():
    from hybridserve.core.bench.prediction import Predictor
    from hybridserve.core.layout.descriptors import Scheme, transfer_cost
    from hybridserve.core.deployments.target import RECALL_MODEL_DIR

    predictor = Predictor(RECALL_MODEL_DIR)
    one, two = (transfer_cost(predictor.prefill, predictor.decode, n, Scheme.VLLM) for n in (100, 1500))
    prediction = predictor.predict((100, 1500))
    assert prediction.num_reads == 1 and prediction.mean_prompt_tokens == 800
    assert prediction.bytes == (one.total_bytes + two.total_bytes) / 2
    served = [getattr(c, "served_descriptors", c.total_descriptors) for c in (one, two)]
    assert prediction.descriptors == sum(served) / 2


class _Called(Exception):
    pass


def test_cli_passes_the_issue_load_on(monkeypatch):
    seen = {}

    def fake(request, progress=None):
        seen["request"] = request
        raise _Called

    monkeypatch.setattr("hybridserve.core.bench.comparison.bench", fake)
    result = CliRunner().invoke(app, [
        "bench", "--deployment", "http://127.0.0.1:8000", "--baseline", "http://127.0.0.1:8300",
        "--control", "http://127.0.0.1:8400", "--metrics", "http://127.0.0.1:8200", "--input-len", "500:12000",
        "--num-requests", "48", "--concurrency", "16", "--probes", "3", "--probe-len", "32768",
        "--probe-after", "16", "--seed", "5"])
    assert isinstance(result.exception, _Called), result.output
    request = seen["request"]
    assert [t.role for t in request.targets] == ["deployment", "baseline", "control"]
    assert request.targets[0].target.url == "http://127.0.0.1:8000"
    assert request.targets[0].metrics_urls == ("http://127.0.0.1:8200",)
    (phase,) = request.phases
    assert phase.load == Load(max_concurrency=16) and phase.num_requests == 48
    assert phase.input_len == LengthDist(min_tokens=500, max_tokens=12000)
    assert phase.probe == ProbeSpec(num_probes=3, input_tokens=32768, output_tokens=16, after_requests=16)
    assert request.seed == 5


@pytest.mark.parametrize("args, named", [
    (["--input-len", "9:3"], "--input-len"), (["--output-len", "0"], "--output-len"),
    (["--concurrency", "0"], "--concurrency"), (["--request-rate", "0"], "--request-rate"),
    (["--fault", "melt"], "--fault"), (["--metrics", "decode:8200"], "--metrics"),
    (["--baseline", "nowhere"], "--baseline"), (["--probes", "2", "--probe-len", "0"], "--probe-len"),
    (["--num-requests", "0"], "--num-requests"), (["--fault", "slow_decode", "--deployment", "http://x:1"], "fault"),
])
def test_cli_refuses_bad_input_in_one_line_with_exit_2(args, named):
    result = CliRunner().invoke(app, ["bench", *args])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and named in lines[0] and "Traceback" not in result.output


class FakeServer:
    """An OpenAI-compatible streaming endpoint (httpx.MockTransport): each request streams its max_tokens tokens,
    one chunk per `gap_s`, and the server notes how many requests are in flight and when probes arrive."""

    def __init__(self, gap_s=0.01):
        import asyncio

        self.asyncio, self.gap_s = asyncio, gap_s
        self.in_flight = self.max_in_flight = self.finished = 0
        self.probe_seen_after = []  # requests finished when each probe (a 99-token prompt) arrived
        self.bodies = []

    async def handler(self, request):
        import httpx

        body = json.loads(request.content)
        self.bodies.append(body)
        if len(body["prompt"]) == 99:
            self.probe_seen_after.append(self.finished)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)

        async def events():
            for n in range(1, body["max_tokens"] + 1):
                await self.asyncio.sleep(self.gap_s)
                chunk = {"choices": [{"text": "x"}], "usage": {"completion_tokens": n}}
                yield f"data: {json.dumps(chunk)}\n\n".encode()
            self.in_flight -= 1  # before [DONE]: the client stops reading there
            self.finished += 1
            yield b"data: [DONE]\n\n"

        return httpx.Response(200, content=events())


def _work(load, num, probe=None, rng_seed=0):
    from hybridserve.core.bench.phase import draw_work

    spec = PhaseSpec(load=load, num_requests=num, input_len=LengthDist(min_tokens=5, max_tokens=9),
                     output_len=LengthDist(min_tokens=3, max_tokens=3), probe=probe)
    return draw_work(spec, random.Random(rng_seed))


def _drive(server, work):
    import httpx

    from hybridserve.core.bench.driver import run_phase

    prompts = make_prompts(work.input_lens, vocab_size=100, excluded=set(), rng=random.Random(1))
    probe = work.spec.probe
    probes = make_prompts((99,) * probe.num_probes, vocab_size=100, excluded=set(), rng=random.Random(2)) if probe else ()
    return run_phase("http://fake", "m", work, prompts, probes, timeout_s=10,
                     transport=httpx.MockTransport(server.handler))


def test_driver_keeps_the_concurrency_and_sends_probes_after_the_requests_it_waits_for():
    server = FakeServer()
    probe = ProbeSpec(num_probes=2, input_tokens=99, output_tokens=3, after_requests=4)
    records = _drive(server, _work(Load(max_concurrency=3), 9, probe))
    assert server.max_in_flight == 3 + 1  # the load's 3, and one probe at a time beside it
    assert server.probe_seen_after[0] >= 4 and len(server.probe_seen_after) == 2
    load = [r for r in records if not r.is_probe]
    assert [r.input_tokens for r in load] == list(_work(Load(max_concurrency=3), 9).input_lens)  # in order
    assert len(load) == 9 and sum(r.is_probe for r in records) == 2
    assert all(r.output_tokens == 3 and len(r.itl_s) == 2 and r.ttft_s > 0 for r in records)
    body = server.bodies[0]
    assert body["ignore_eos"] is True and body["max_tokens"] == 3 and body["stream"] is True
    assert all(isinstance(t, int) for t in body["prompt"])


def test_driver_idle_is_one_at_a_time_and_a_rate_waits_for_the_arrivals():
    server = FakeServer()
    _drive(server, _work(Load(max_concurrency=1), 4))
    assert server.max_in_flight == 1
    work = _work(make_load(None, 20.0), 6)
    records = _drive(FakeServer(), work)
    for record, offset in zip(records, work.offsets_s):
        assert record.start_s >= offset - 1e-3  # never sent before its Poisson arrival


def _report_with_control():
    from hybridserve.core.bench.phase import draw_work
    from hybridserve.core.bench.engine_timing import EngineTiming
    from hybridserve.core.bench.prediction import Prediction
    from hybridserve.core.bench.comparison import BenchReport, PhaseResult, TargetResult
    from hybridserve.core.bench.vocab import Vocabulary

    work = draw_work(PhaseSpec(load=Load(max_concurrency=1), num_requests=2, input_len=LengthDist(
        min_tokens=8, max_tokens=8), output_len=LengthDist(min_tokens=4, max_tokens=4)), random.Random(0))
    nixl = server_metrics.NixlStats(num_transfers=2, mean_xfer_s=0.005, p50_xfer_s=0.004, mean_post_s=0.002,
                                    mean_bytes=2e6, mean_descriptors=280.0, num_failed_transfers=0, num_kv_expired=0)
    targets = []
    for role, ttft, stats in (("deployment", 0.3, nixl), ("baseline", 0.2, None), ("control", 0.22, None)):
        records = tuple(_record(i, ttft, 1.0, (0.01, 0.01, 0.01)) for i in range(2))
        phase = PhaseResult(spec=work.spec, client=client_stats.summarize(records), probes=None, nixl=stats,
                            records=records, engine=EngineTiming(num_requests=2, mean_queue_s=0.001,
                                                                 mean_prefill_s=ttft - 0.05, mean_server_ttft_s=None))
        targets.append(TargetResult(role=role, label=role, url=f"http://{role}", metrics_urls=(f"http://{role}",),
                                    run_dir=None, phases=(phase,), elapsed_s=1.0))
    plan = Prediction(mean_prompt_tokens=8, num_reads=1, descriptors=280.0, is_served_count=True,
                      unmerged_descriptors=63060.0, fragmented_descriptors=None, bytes=2e6)
    return BenchReport(model="m", vocabulary=Vocabulary(size=100), seed=0, prompt_seed=1, phases=(work,),
                       predictions=(plan,), probe_predictions=(None,), targets=tuple(targets), elapsed_s=3.0)


def test_render_puts_ratios_nixl_stats_and_plan_side_by_side():
    from rich.console import Console

    from hybridserve.cli.bench_render import render, report_dict

    report = _report_with_control()
    console = Console(width=250, record=True)
    render(console, report)
    text = console.export_text()
    assert "deployment / baseline" in text and "control / baseline" in text
    ttft = next(line for line in text.splitlines() if "TTFT p50" in line)
    assert "1.50x" in ttft and "1.10x" in ttft  # 0.3 / 0.2 and the A/A control's 0.22 / 0.2
    prefill = next(line for line in text.splitlines() if "engines: prefill" in line)
    assert "250.0" in prefill and "150.0" in prefill and "1.67x" in prefill  # 0.25 / 0.15: the engines' own share
    assert "engines: API server TTFT" in text  # a row of dashes where vLLM said nothing
    descriptors = next(line for line in text.splitlines() if "descriptors / transfer" in line)
    assert descriptors.count("280.0") == 2  # served beside plan's merged count
    assert "63,060" in text
    data = json.loads(json.dumps(report_dict(report)))
    assert data["targets"][0]["phases"][0]["nixl"]["num_transfers"] == 2
    assert data["phases"][0]["prediction"]["descriptors"] == 280.0


def test_a_stream_cut_before_done_is_a_failed_request():
    import httpx

    from hybridserve.core.bench.driver import run_phase

    async def handler(request):
        async def events():
            yield b'data: {"choices": [{"text": "x"}], "usage": {"completion_tokens": 1}}\n\n'  # then gone
        return httpx.Response(200, content=events())

    work = _work(Load(max_concurrency=1), 1)
    prompts = make_prompts(work.input_lens, vocab_size=100, excluded=set(), rng=random.Random(1))
    (record,) = run_phase("http://fake", "m", work, prompts, (), timeout_s=5, transport=httpx.MockTransport(handler))
    assert record.error == "stream ended without [DONE]" and not record.is_ok


def test_cli_writes_png_and_json_out(monkeypatch, tmp_path):
    monkeypatch.setattr("hybridserve.core.bench.comparison.bench", lambda request, progress=None: _report_with_control())
    out, png = tmp_path / "b.json", tmp_path / "b.png"
    result = CliRunner().invoke(app, ["bench", "--deployment", "http://d", "--baseline", "http://b", "--out", str(out),
                                      "--png", str(png), "--output-len", "4"])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["targets"][2]["role"] == "control"
    assert png.read_bytes()[:4] == b"\x89PNG" and "control / baseline" in result.stdout


def test_a_stream_is_split_at_line_feeds_only():
    """JSON leaves U+2028 and U+0085 unescaped (json.dumps(ensure_ascii=False), as vLLM's API server writes): a
    line split at them, as httpx's aiter_lines does, is "not JSON". A character cut between chunks stays whole."""
    import asyncio

    import httpx

    text = "a\u2028b\u0085c\u00e9"
    event = f"data: {json.dumps({'choices': [{'text': text}], 'usage': {'completion_tokens': 1}}, ensure_ascii=False)}"
    raw = f"{event}\n\ndata: [DONE]\n\n".encode()
    cut = raw.index("\u00e9".encode()) + 1  # inside the two bytes of é

    async def handler(request):
        async def chunks():
            yield raw[:cut]
            yield raw[cut:]
        return httpx.Response(200, content=chunks())

    async def drive():
        from hybridserve.core.bench.stream import stream_one

        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await stream_one(client, "http://fake", "m", (1, 2, 3), 1, phase_start=0.0)

    record = asyncio.run(drive())
    assert record.error is None and record.output_tokens == 1


def test_a_front_door_without_metrics_gives_client_numbers_only():
    """Ray Serve's ingress answers /metrics with 404 (its engines report to Ray's agent): bench then scrapes nothing
    instead of refusing to run; a server that has /metrics is scraped."""
    import httpx

    from hybridserve.core.bench.scrape import own_metrics

    def answer(status: int) -> httpx.Client:
        return httpx.Client(transport=httpx.MockTransport(lambda request: httpx.Response(status, text="")))

    assert own_metrics(answer(404), "http://ray:8000") == ()
    assert own_metrics(answer(200), "http://vllm:8000") == ("http://vllm:8000",)
