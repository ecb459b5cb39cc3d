"""bench's descriptor prediction follows the requests the measured deployment served in this run (no servers).

The model is test_plan_served.py's 60-layer H200 one (FlashAttention: 2096-token blocks, 15 shared tensors, 45 GDN
layers = 180 GDN pieces). Its served means 195 / 210 / 280 at 1k / 8k / 32k came from a fresh server sent a 1k
warm-up, then 3 requests of each length in that order, one at a time, 16 output tokens each.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

from hybridserve.core.bench.lengths import LengthDist
from hybridserve.core.bench.load import Load
from hybridserve.core.bench.phase import PhaseSpec, ProbeSpec, draw_work
from hybridserve.core.bench.prediction import FRESH_ASSUMPTION, HISTORY, Predictor, RANGE
from hybridserve.core.layout.descriptors import Scheme, transfer_cost
from hybridserve.core.layout.served import runs_of_requests, served_runs

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from make_gdn_bench_model import geometry  # noqa: E402

GDN = 45 * 4  # 3 conv pieces + the SSM state per GDN layer, never merged
IDLE = Load(max_concurrency=1)


@pytest.fixture(scope="module")
def m60(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("m60")
    config = dict(geometry(1, num_layers=60, hidden_size=1024), architectures=["Qwen3_5ForCausalLM"],
                  model_type="qwen3_5_text", mamba_ssm_dtype="float32", eos_token_id=0, pad_token_id=0)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def predictor(m60):
    from hybridserve.core.launch.topology import Device

    return Predictor(m60, device=Device.CUDA)  # launch's CUDA layout: the one the H200 served


def _phase(num, tokens, *, load=IDLE, output=16, probe=None):
    spec = PhaseSpec(load=load, num_requests=num, input_len=LengthDist(min_tokens=tokens, max_tokens=tokens),
                     output_len=output if isinstance(output, LengthDist) else LengthDist(min_tokens=output,
                                                                                          max_tokens=output),
                     probe=probe)
    return draw_work(spec, random.Random(0))


def test_the_h200_run_history_predicts_the_served_means(predictor):
    assert (predictor.decode.block_size, predictor.decode.num_tensors) == (2096, 15)
    works = [_phase(1, 1024), _phase(3, 1024), _phase(3, 8192), _phase(3, 32768)]  # warm-up, then 3 a length
    predictions = predictor.predict_phases(works, is_started=True)
    assert [p.descriptors for p in predictions] == [195, 195, 210, 280]
    assert all(p.basis == HISTORY and not p.is_range and p.num_reads == 1 for p in predictions)
    assert [p.fresh_descriptors for p in predictions] == [15 + GDN] * 4  # a fresh server's first request
    assert predictions[3].fragmented_descriptors == 15 * 16 + GDN


def test_each_phase_starts_where_the_earlier_phases_left_the_free_queue(predictor):
    longer, shorter = _phase(3, 32768), _phase(3, 8192)
    after_longer = predictor.predict_phases([longer, shorter], is_started=True)[1]
    alone = predictor.predict_phases([shorter], is_started=True)[0]
    assert after_longer.descriptors > after_longer.fresh_descriptors == 15 + GDN
    assert after_longer.descriptors != alone.descriptors  # the 32k phase's freed blocks come back descending
    # the same as the whole run's sequence through served.py's fixed-output model, taken per request
    runs = served_runs(predictor.prefill, predictor.decode, [32768] * 3 + [8192] * 3, output_tokens=16)[3:]
    expected = [transfer_cost(predictor.prefill, predictor.decode, 8192, Scheme.VLLM, served_runs=r)
                .served_descriptors for r in runs]
    assert after_longer.descriptors == pytest.approx(sum(expected) / 3)


def test_each_request_keeps_its_own_output_length(predictor):
    layouts = predictor.prefill, predictor.decode
    assert runs_of_requests(*layouts, [(8192, 16)] * 4) == served_runs(*layouts, [8192] * 4, output_tokens=16)
    # 1,100 output tokens take a 1k request's decode side into a second 2096-token block: decode frees one block
    # more than prefill, so the next request's ids pair up differently on the two sides
    short, long = (runs_of_requests(*layouts, [(1024, out)] + [(8192, 16)] * 3) for out in (16, 1100))
    assert short != long
    works = [_phase(1, 1024, output=1100), _phase(3, 8192)]
    predicted = predictor.predict_phases(works, is_started=True)[1].descriptors
    assert predicted == pytest.approx(15 * sum(long[1:]) / 3 + GDN)
    assert predicted != predictor.predict_phases([_phase(1, 1024), _phase(3, 8192)], is_started=True)[1].descriptors


def test_two_decodes_behind_one_prefill_keep_their_own_pools(predictor):
    layouts = predictor.prefill, predictor.decode
    requests = [(32768, 16), (8192, 16), (8192, 16), (8192, 16)]
    # one decode: the same as before (decode_of all 0)
    assert runs_of_requests(*layouts, requests, decode_of=[0, 0, 0, 0]) == runs_of_requests(*layouts, requests)
    # the 32k request went to decode 1: decode 0's pool is fresh for its first 8k request, while the prefill hands
    # it the 32k request's recycled (descending) ids, so it cannot merge like two fresh servers would
    shared = runs_of_requests(*layouts, requests, decode_of=[1, 0, 0, 0])
    fresh_both = runs_of_requests(*layouts, [(8192, 16)])
    assert shared[1] != fresh_both[0]
    assert shared[1:] != runs_of_requests(*layouts, requests)[1:]


def test_a_url_deployment_is_predicted_under_a_named_assumption(predictor):
    works = [_phase(1, 1024), _phase(3, 8192)]
    started = predictor.predict_phases(works, is_started=True)
    by_url = predictor.predict_phases(works, is_started=False)
    assert [p.descriptors for p in by_url] == [p.descriptors for p in started]
    assert all(p.basis == FRESH_ASSUMPTION and "URL" in p.why for p in by_url)


@pytest.mark.parametrize("concurrent", [
    dict(load=Load(max_concurrency=4)), dict(load=Load(max_concurrency=None, request_rate=2.0)),
    dict(probe=ProbeSpec(num_probes=1, input_tokens=32768, output_tokens=16, after_requests=1))],
    ids=["concurrency", "poisson", "idle-with-probes"])
def test_requests_in_flight_together_give_the_fresh_to_fragmented_range(predictor, concurrent):
    works = [_phase(3, 1024), _phase(4, 8192, **concurrent), _phase(3, 8192)]
    first, mixed, after = predictor.predict_phases(works, is_started=True)
    assert first.basis == HISTORY and not first.is_range
    lens = works[1].all_input_lens
    fresh = [transfer_cost(predictor.prefill, predictor.decode, n, Scheme.VLLM) for n in lens]
    assert mixed.basis == RANGE and mixed.is_range
    assert mixed.descriptors == sum(c.served_descriptors for c in fresh) / len(lens)  # each a first request
    assert mixed.descriptors_max == sum(c.fragmented_descriptors for c in fresh) / len(lens)  # a run per block
    assert mixed.descriptors < mixed.descriptors_max
    assert after.is_range and "phase 2" in after.why  # the free queue after it is not followed


def test_the_table_and_json_say_which_basis(predictor):
    from rich.console import Console

    from hybridserve.cli.bench_render import render, report_dict
    from test_bench import _report_with_control

    report = _report_with_control()
    for works, is_started, shown in (([_phase(3, 32768)], False, "fresh-server assumption"),
                                     ([_phase(3, 8192, load=Load(max_concurrency=2))], True, "(range)")):
        from dataclasses import replace
        prediction = predictor.predict_phases(works, is_started=is_started)[0]
        console = Console(width=250, record=True)
        render(console, replace(report, predictions=(prediction,)))
        line = next(x for x in console.export_text().splitlines() if "descriptors / transfer" in x)
        assert "280.0" in line and shown in line  # the served mean beside the marked prediction
        data = json.loads(json.dumps(report_dict(replace(report, predictions=(prediction,)))))
        assert data["phases"][0]["prediction"]["basis"] == prediction.basis
    assert data["phases"][0]["prediction"]["descriptors_max"] == 15 * 4 + GDN


def test_bench_predicts_from_history_only_for_a_deployment_it_started():
    from hybridserve.core.bench.comparison import BenchRequest, BenchTarget, _started_deployment
    from hybridserve.core.validate import parse_target

    def request(deployment, baseline):
        return BenchRequest(targets=(BenchTarget(role="deployment", target=parse_target(deployment, what="d")),
                                     BenchTarget(role="baseline", target=parse_target(baseline, what="b"))),
                            phases=())

    assert _started_deployment(request("pd-sync", "http://127.0.0.1:8300"))
    assert not _started_deployment(request("http://127.0.0.1:8000", "single-sync"))  # a started baseline: no


def test_a_first_token_from_prefill_moves_one_token_more(predictor, m60):
    """Behind a proxy whose token 1 comes from prefill (core/proxy/first_token.py) prefill holds all N prompt tokens,
    not vLLM's N - 1: a 2097-token prompt moves 2096 tokens (1 block of 2096) the vLLM way, 2097 (2 blocks) here."""
    from hybridserve.core.launch.topology import Device

    shifted = Predictor(m60, device=Device.CUDA, is_first_token_from_prefill=True)
    works = [_phase(1, 2097)]
    vllm_way = predictor.predict_phases(works, is_started=True)[0]
    ours = shifted.predict_phases(works, is_started=True)[0]
    assert vllm_way.descriptors == 15 + GDN  # one attention block per tensor, one run
    assert ours.descriptors == 15 + GDN and ours.bytes > vllm_way.bytes  # two adjacent blocks: still one run each
    assert ours.unmerged_descriptors > vllm_way.unmerged_descriptors
    assert ours.mean_prompt_tokens == vllm_way.mean_prompt_tokens == 2097  # the client's prompt, as sent


def test_the_h200_first_token_runs_history_predicts_what_decode_posted(m60):
    """benchmarks/served_pd.py --compare-first-token on the H200 (2026-12-03, both calls): a warm-up of 2 requests
    through the first-token proxy and 1 the vLLM way, then per length 5 of each way, in that order. Decode posted
    195 / 195, 204 / 201, 276 / 309 (first token from prefill / vLLM's way; benchmarks/HISTORY.md, Served P/D at
    60 layers, H200): from prefill a request moves N tokens, which hands the next one other runs."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("served_pd", Path(__file__).parents[1] / "benchmarks/served_pd.py")
    served_pd = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(served_pd)
    prof = dict(served_pd.profile(False), model=str(m60))
    # the flags of that run (eager, Triton's GDN prefill: benchmarks/HISTORY.md), not today's profile
    prof["launch"] = ["--device", "cuda", "--model", str(m60), "--max-model-len", "34816", "--enforce-eager",
                      "--gdn-prefill-backend", "triton"]
    sent = [("warm", [(257, 31)] * 2), ("warm_decode_first", [(256, 32)])]
    for length in (1024, 8192, 32768):
        sent += [(f"idle_{length}", [(length + 1, 31)] * 5), (f"idle_{length}_decode_first", [(length, 32)] * 5)]
    counts = served_pd.plan_by_history(prof, sent)
    assert [counts[f"idle_{n}{way}"] for n in (1024, 8192, 32768) for way in ("", "_decode_first")] == \
        [195, 195, 204, 201, 276, 309]
