"""plan's sizing simulation: vLLM's scheduling rules (token budget, chunked prefill, sequence cap, blocks,
preemption), P/D's hand-over, routing, and the numbers it reports; times checked against the step formula by hand."""

from __future__ import annotations

import random

import pytest

from hybridserve.core.bench.phase import PhaseSpec, draw_work
from hybridserve.core.bench.lengths import LengthDist
from hybridserve.core.bench.load import Load
from hybridserve.core.launch.topology import RoutingPolicy
from hybridserve.core.sizing.served_stats import from_simulation, served_stats
from hybridserve.core.sizing.simulate import EngineSpec, SimDeployment, simulate
from hybridserve.core.sizing.step_fit import fit_steps, fit_transfer, itl_observation, ttft_observation
from hybridserve.core.sizing.step_profile import EngineLimits, StepCoefficients
from hybridserve.core.sizing.workload import Slo, make_workload

C = StepCoefficients(base_s=0.01, token_s=1e-5, seq_s=1e-3, attention_s=0.0, http_s=0.002)


def _spec(*, seqs: int = 8, budget: int = 2048, blocks: int = 10_000, block: int = 256, states: int = 3,
          coefficients: StepCoefficients = C) -> EngineSpec:
    """blocks_for: one attention group of `block`-token blocks plus `states` GDN state blocks (Qwen3.5's 3 GDN
    groups, capacity.py)."""
    return EngineSpec(coefficients=coefficients, limits=EngineLimits(max_num_seqs=seqs, max_num_batched_tokens=budget,
                                                                     max_model_len=100_000),
                      num_blocks=blocks, blocks_for=lambda tokens: -(-tokens // block) + states)


def _step(tokens: int, seqs: int) -> float:
    return C.base_s + C.token_s * tokens + C.seq_s * seqs


def test_a_long_prompt_runs_in_budget_chunks_then_decodes():
    result = simulate(SimDeployment(replica=_spec(), num_replicas=1, http_s=C.http_s), [(0.0, 5000, 3)])
    request = result.requests[0]
    prefill = _step(2048, 1) + _step(2048, 1) + _step(904, 1)  # 5000 = 2048 + 2048 + 904
    assert request.ttft_s == pytest.approx(prefill + C.http_s)
    assert request.itls_s == pytest.approx([_step(1, 1), _step(1, 1)])


def test_the_sequence_cap_and_the_budget_bound_each_batch():
    arrivals = [(0.0, 100, 4)] * 5
    result = simulate(SimDeployment(replica=_spec(seqs=2), num_replicas=1, http_s=C.http_s), arrivals)
    first = sorted(r.token_times[0] for r in result.requests)
    # two at a time: requests 1-2 share a prefill step, 3-4 wait until a seat frees
    assert first[0] == first[1] == pytest.approx(_step(200, 2) + C.http_s)
    assert first[2] > first[1] + 3 * _step(2, 2) - 1e-9


def test_blocks_cap_concurrency_and_growth_preempts_the_last_admitted():
    # 6 blocks: two requests of 200 tokens need 1 + 3 blocks each at first; growing past 256 tokens needs a 5th
    result = simulate(SimDeployment(replica=_spec(blocks=9, block=256), num_replicas=1), [(0.0, 200, 80)] * 2)
    assert result.num_preemptions >= 1
    assert all(len(r.token_times) == 80 for r in result.requests)


def test_pd_hands_over_after_the_first_token_and_charges_the_read():
    read_s = 0.05
    deployment = SimDeployment(prefill=_spec(), num_prefill=1, decode=_spec(), num_decode=1,
                               transfer_s=lambda tokens: read_s, http_s=C.http_s)
    request = simulate(deployment, [(0.0, 1000, 3)]).requests[0]
    assert request.ttft_s == pytest.approx(_step(1000, 1) + C.http_s)
    # token 2: the proxy's hop, decode's READ of 1,000 tokens, one step computing token 1's position
    assert request.itls_s[0] == pytest.approx(C.http_s + read_s + _step(1, 1))
    assert request.itls_s[1] == pytest.approx(_step(1, 1))
    assert request.served_by == ["prefill-0", "decode-0"]


def test_prefill_keeps_its_blocks_until_decode_has_read_them():
    # prefill holds 4 blocks a request and has 4: the second request waits for the first one's READ
    deployment = SimDeployment(prefill=_spec(blocks=4), num_prefill=1, decode=_spec(), num_decode=1,
                               transfer_s=lambda tokens: 1.0, http_s=0.0)
    second = simulate(deployment, [(0.0, 200, 2), (0.0, 200, 2)]).requests[1]
    assert second.ttft_s > 1.0


def test_requests_arriving_together_meet_in_one_step_on_each_replica():
    deployment = SimDeployment(replica=_spec(), num_replicas=2, http_s=C.http_s)
    result = simulate(deployment, [(0.0, 100, 2)] * 4)
    assert sorted(r.ttft_s for r in result.requests) == pytest.approx([_step(200, 2) + C.http_s] * 4)
    assert sorted(r.served_by[0] for r in result.requests) == ["replica-0"] * 2 + ["replica-1"] * 2


@pytest.mark.parametrize("policy,expected", [
    (RoutingPolicy.ROUND_ROBIN, ["replica-0", "replica-1", "replica-0", "replica-1"]),
    (RoutingPolicy.LEAST_OUTSTANDING, ["replica-0", "replica-1", "replica-1", "replica-1"]),
], ids=["round-robin", "least-outstanding"])
def test_the_policy_picks_as_the_proxy_does(policy, expected):
    """A long request holds replica-0; short ones come and go: least_outstanding keeps them off replica-0."""
    deployment = SimDeployment(replica=_spec(), num_replicas=2, policy=policy)
    result = simulate(deployment, [(0.0, 5000, 200), (0.5, 100, 2), (1.0, 100, 2), (1.5, 100, 2)])
    assert [r.served_by[0] for r in result.requests] == expected


def test_the_workload_draws_what_bench_draws():
    workload = make_workload("100:400", "32:128", 3.0, num_requests=20, seed=7)
    spec = PhaseSpec(load=Load(max_concurrency=None, request_rate=3.0), num_requests=20,
                     input_len=LengthDist(min_tokens=100, max_tokens=400),
                     output_len=LengthDist(min_tokens=32, max_tokens=128))
    work = draw_work(spec, random.Random(7))
    assert workload.draw() == list(zip(work.offsets_s, work.input_lens, work.output_lens))


def test_goodput_counts_requests_within_both_slos():
    result = simulate(SimDeployment(replica=_spec(), num_replicas=1, http_s=C.http_s), [(0.0, 100, 3), (0.0, 100, 3)])
    stats = served_stats(from_simulation(result), Slo(ttft_s=1.0, itl_s=1.0), num_units=1)
    assert stats.attainment == 1.0 and stats.goodput == pytest.approx(2 / stats.wall_s)
    tight = served_stats(from_simulation(result), Slo(ttft_s=1e-4, itl_s=1.0), num_units=2)
    assert tight.goodput == 0.0 and not tight.is_slo_met and tight.goodput_per_unit == 0.0


def test_the_fit_recovers_known_coefficients():
    true = StepCoefficients(base_s=0.008, token_s=2e-5, seq_s=3e-4, attention_s=2e-9, http_s=0.004)

    def value(obs):
        return sum(f * c for f, c in zip(obs.features, (true.http_s, true.base_s, true.token_s, true.seq_s,
                                                         true.attention_s)))
    observations = [ttft_observation(n, 2048, 0.0) for n in (64, 256, 1024, 1800, 5000)]
    observations += [itl_observation(b, c, 32, 0.0) for b in (1, 2, 4, 8) for c in (128, 1024)]
    fitted, report = fit_steps([type(o)(what=o.what, features=o.features, value_s=value(o)) for o in observations])
    for name in ("base_s", "token_s", "seq_s", "attention_s", "http_s"):
        assert getattr(fitted, name) == pytest.approx(getattr(true, name), rel=1e-3), name
    assert len(report) == len(observations)
    transfer = fit_transfer([(d, b, 0.004 + d * 1e-5 + b / 2e9) for d, b in ((10, 1e6), (20, 4e6), (30, 9e6))])
    assert (transfer.post_s, transfer.descriptor_s, transfer.bytes_per_s) == pytest.approx((0.004, 1e-5, 2e9))


def test_a_negative_coefficient_is_dropped_not_kept():
    # TTFTs that fall with length cannot make a negative per-token cost
    observations = [ttft_observation(n, 2048, v) for n, v in ((100, 0.02), (1000, 0.019), (1900, 0.018))]
    fitted, _ = fit_steps(observations)
    assert min(fitted.base_s, fitted.token_s, fitted.seq_s, fitted.attention_s, fitted.http_s) >= 0.0


def test_a_closed_loop_keeps_its_concurrency():
    result = simulate(SimDeployment(replica=_spec(seqs=8), num_replicas=1, http_s=C.http_s),
                      [(0.0, 100, 4)] * 6, max_concurrency=2)
    starts = sorted(r.arrival_s for r in result.requests)
    assert starts[:2] == [0.0, 0.0] and all(s > 0 for s in starts[2:])
    for request in result.requests:  # never more than 2 in flight when a request is sent
        in_flight = sum(1 for r in result.requests if r.arrival_s <= request.arrival_s < r.end_s)
        assert in_flight <= 2


def test_the_load_factor_found_is_the_one_that_made_the_wall_time(tmp_path):
    from hybridserve.core.launch.topology import TINY_MODEL_DIR
    from hybridserve.core.model.profiles import load_model
    from hybridserve.core.sizing.calibrate import load_factor, simulated_wall_s
    from hybridserve.core.sizing.candidates import Candidate, EngineBuilder
    from hybridserve.core.sizing.step_profile import StepProfile, TransferCost

    profile = StepProfile(name="p", unit="u", device="cpu", model="tiny-qwen3.5", tp=1, coefficients=C,
                          transfer=TransferCost(post_s=0.002), num_blocks=8192,
                          limits=EngineLimits(max_num_seqs=8, max_num_batched_tokens=2048, max_model_len=2048))
    builder = EngineBuilder(load_model(str(TINY_MODEL_DIR)), profile)
    requests = [(64 + 97 * i % 1800, 8 + 13 * i % 120) for i in range(48)]
    for candidate in (Candidate(name="r", num_replicas=2, replica_tp=1),
                      Candidate(name="pd", num_prefill=1, prefill_tp=1, num_decode=1, decode_tp=1)):
        wall = simulated_wall_s(builder, candidate, requests, 16, 2.5)
        assert load_factor(builder, candidate, requests, 16, wall) == pytest.approx(2.5, rel=0.01)
