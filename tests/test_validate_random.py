"""validate --dataset random without vLLM: the token-id prompts, the measured near-tie tolerance, the per-prompt
verdict, and the CLI end to end against fake OpenAI-compatible servers that answer token-id prompts."""

import json

import pytest
from typer.testing import CliRunner

from _app_threads import served_apps
from hybridserve.cli.app import app
from hybridserve.core.common.errors import CouldNotRunError, InputError
from hybridserve.core.deployments.client import Completion
from hybridserve.core.validate.dataset import AnswerKind, Example
from hybridserve.core.validate.metrics import compare
from hybridserve.core.validate.noise import measure
from hybridserve.core.validate.random_prompts import random_dataset, vocab_size

runner = CliRunner()


def test_prompts_are_seeded_exact_in_length_and_below_the_vocabulary():
    one = random_dataset([7, 300], num_per_length=3, seed=4, num_vocab=50)
    assert [len(e.prompt) for e in one.examples] == [7, 7, 7, 300, 300, 300]
    assert all(isinstance(t, int) and 0 <= t < 50 for e in one.examples for t in e.prompt)
    assert one == random_dataset([7, 300], num_per_length=3, seed=4, num_vocab=50)
    assert one.examples != random_dataset([7, 300], num_per_length=3, seed=5, num_vocab=50).examples
    assert one.is_token_ids and all(e.answer_kind is AnswerKind.NONE for e in one.examples)
    with pytest.raises(InputError, match="--prompt-len 0"):
        random_dataset([0], num_per_length=1, seed=0, num_vocab=50)


@pytest.mark.parametrize("config", [{"vocab_size": 1024}, {"text_config": {"vocab_size": 248320}}, {}],
                         ids=["text", "multimodal", "missing"])
def test_vocab_size_comes_from_config_json(tmp_path, config):
    (tmp_path / "config.json").write_text(json.dumps(config))
    if not config:
        with pytest.raises(InputError, match="no vocab_size"):
            vocab_size(tmp_path)
    else:
        assert vocab_size(tmp_path) == (config.get("vocab_size") or config["text_config"]["vocab_size"])


def completion(tokens, tops):
    """tops: per position {token: logprob}; the chosen token's logprob is its entry."""
    return Completion(text="", tokens=tuple(tokens), logprobs=tuple(t[k] for k, t in zip(tokens, tops)),
                      top2_gaps=tuple(sorted(t.values())[-1] - sorted(t.values())[-2] for t in tops), top=tuple(tops))


def test_noise_is_the_largest_margin_change_or_clean_divergence_gap():
    base = completion(["a", "b", "c"], [{"a": -0.1, "x": -2.0}, {"b": -0.5, "y": -0.6}, {"c": -0.2, "z": -0.25}])
    other = completion(["a", "b", "z"], [{"a": -0.12, "x": -1.9}, {"b": -0.52, "y": -0.59}, {"z": -0.2, "c": -0.22}])
    noise = measure("ref", [base], [other])
    assert noise.num_positions == 2  # positions 0 and 1 agree; position 2 is the clean runs' divergence
    assert noise.max_margin_change == pytest.approx(max(abs(1.78 - 1.9), abs(0.07 - 0.1)))
    assert noise.divergence_gaps == (pytest.approx(0.05),)
    assert noise.tolerance == pytest.approx(0.12)
    with pytest.raises(CouldNotRunError, match="no position"):
        measure("ref", [completion(["a"], [{"a": -0.1, "x": -2.0}])], [completion(["x"], [{"x": -0.1, "a": -2}])])


def test_a_prompt_regresses_on_a_clear_divergence_not_on_a_near_tie():
    example = Example(prompt=(1, 2, 3), answer=None, answer_kind=AnswerKind.NONE)
    base = completion(["a", "b"], [{"a": -0.1, "x": -3.0}, {"b": -0.5, "y": -0.52}])
    tie = compare(0, example, base, completion(["a", "y"], [{"a": -0.1, "x": -3.0}, {"y": -0.5, "b": -0.51}]), 0.05)
    clear = compare(1, example, base, completion(["x", "b"], [{"x": -0.2, "a": -0.3}, {"b": -0.5, "y": -0.52}]), 0.05)
    assert (tie.first_divergence, tie.is_near_tie, tie.regression(0.05)) == (1, True, None)
    assert tie.num_prompt_tokens == 3 and tie.first_token_drift == pytest.approx(0.0)
    assert clear.first_divergence == 0 and clear.divergence_gap == pytest.approx(2.9)
    assert clear.regression(0.05) == ("diverged at token 0 (baseline top-2 gap 2.9, the candidate moved the "
                                      "baseline's token by 0.2)")
    assert clear.first_token_drift == pytest.approx(0.2)  # the baseline's token 'a' from the candidate's top-k


def fake_app(mode):
    fastapi = pytest.importorskip("fastapi")
    api = fastapi.FastAPI()
    seen = []

    @api.get("/v1/models")
    def models():
        return {"object": "list", "data": [{"id": "fake", "object": "model"}]}

    @api.post("/v1/completions")
    def completions(body: dict):
        prompt = body["prompt"]
        assert isinstance(prompt, list) and body["return_tokens_as_token_ids"] and body["ignore_eos"]
        seen.append(body)
        first, n = sum(prompt) % 97, body["max_tokens"]
        tokens = [f"token_id:{first + i}" for i in range(n)]
        runner_up = [f"token_id:{500 + i}" for i in range(n)]
        gaps = [0.004 if i == 1 else 3.0 for i in range(n)]  # position 1 is a near-tie in the baseline
        shift = {"base": 0.0, "ref": 0.01, "tie": 0.0, "diverge": 0.0, "moved": 0.0}[mode]
        if mode in ("tie", "moved") and len(prompt) % 2 == 0:  # flips the near-tie of half the prompts
            tokens[1], runner_up[1] = runner_up[1], tokens[1]
        if mode == "diverge" and len(prompt) % 2 == 0:  # a clear flip
            tokens[0], runner_up[0] = runner_up[0], tokens[0]
        top = [{t: -0.1, r: -0.1 - g - shift} for t, r, g in zip(tokens, runner_up, gaps)]
        if mode == "moved" and len(prompt) % 2 == 0:  # ...and the baseline's token fell by 0.5: not noise
            top[1][runner_up[1]] = -0.6
        return {"choices": [{"text": "", "logprobs": {"tokens": tokens, "token_logprobs": [-0.1] * n,
                                                      "top_logprobs": top}}]}

    return api


@pytest.fixture(scope="module")
def servers():
    pytest.importorskip("uvicorn")
    with served_apps({mode: fake_app(mode) for mode in ("base", "ref", "tie", "diverge", "moved")}) as urls:
        yield urls


def cli(servers, candidate, tmp_path, *, as_json=True):
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 64}))
    return runner.invoke(app, ["validate", "--baseline", servers["base"], "--candidate", servers[candidate],
                               "--reference", servers["ref"], "--dataset", "random", "--prompt-len", "20", "31",
                               "--num-prompts", "2", "--model", str(tmp_path), *(["--json"] if as_json else [])])


def test_cli_forgives_flips_below_the_measured_tolerance(servers, tmp_path):
    result = cli(servers, "tie", tmp_path)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["near_tie_tolerance"] == {"value": pytest.approx(0.01), "source": "measured"}
    assert [p["prompt_tokens"] for p in report["prompts"]] == [20, 20, 31, 31]
    assert [p["first_divergence"] for p in report["prompts"]] == [1, 1, None, None]
    assert all(p["is_near_tie"] for p in report["prompts"][:2]) and report["metrics"]["near_tie_share"] == 1.0
    table = cli(servers, "tie", tmp_path, as_json=False)
    assert table.exit_code == 0 and "per prompt" in table.stdout and "measured" in table.stdout, table.output


def test_cli_fails_each_prompt_with_a_clear_flip(servers, tmp_path):
    result = cli(servers, "diverge", tmp_path)
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert [p["passed"] for p in report["prompts"]] == [False, False, True, True]
    assert report["prompts"][0]["divergence_top2_gap"] == pytest.approx(3.0)
    assert "regressed_prompts" in report["failed_metrics"] and report["metrics"]["near_tie_share"] == 0.0


def test_cli_fails_a_near_tie_flip_where_the_candidate_moved_the_baselines_token_beyond_the_tolerance(servers,
                                                                                                     tmp_path):
    result = cli(servers, "moved", tmp_path)
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert [p["first_divergence"] for p in report["prompts"]] == [1, 1, None, None]
    assert [p["divergence_top2_gap"] for p in report["prompts"][:2]] == [pytest.approx(0.004)] * 2  # near-ties
    assert [p["divergence_drift"] for p in report["prompts"][:2]] == [pytest.approx(0.5)] * 2  # > tolerance 0.01
    assert [p["passed"] for p in report["prompts"]] == [False, False, True, True]


@pytest.mark.parametrize("args, message", [
    (["--prompt-len", "1024"], "only with --dataset random"),
    (["--dataset", "random", "--prompt-len", "8", "x9"], "accepted after --prompt-len: integers"),
    (["--dataset", "random", "--prompt-len", "8", "--top-logprobs", "1", "--model", "profiles/tiny-qwen3.5"],
     "--top-logprobs 1"),
    (["--dataset", "random", "--prompt-len", "8"], "needs --model"),
], ids=["not-random", "not-int", "top-k", "no-model"])
def test_bad_random_inputs_are_refused_in_one_line(args, message):
    result = runner.invoke(app, ["validate", "--baseline", "http://127.0.0.1:9", "--candidate",
                                 "http://127.0.0.1:9", *args])
    assert result.exit_code == 2 and message in result.output, result.output


@pytest.mark.parametrize("clean_drift,limit", [(0.001, 2.0**-5), (0.04, 0.04), (0.109, 0.109)],
                         ids=["identical-runs", "noisy-runs", "noisier-than-the-configured-limit"])
def test_the_drift_limit_is_what_clean_runs_show(clean_drift, limit):
    """A mean drift above the largest drift two clean runs showed at any position is not noise; never below one
    bf16 step (DRIFT_FLOOR); above the configured 0.05 where clean runs drift more (the H200's 60-layer model: 0.109)."""
    from hybridserve.core.validate.noise import Noise
    from hybridserve.core.validate.validation import measured_limits
    from hybridserve.core.validate.thresholds import Thresholds

    noise = Noise(reference="r", num_prompts=1, num_positions=8, max_margin_change=0.01, mean_margin_change=0.005,
                  max_logprob_drift=clean_drift, mean_logprob_drift=clean_drift / 2, divergence_gaps=(0.03,))
    limits = measured_limits(Thresholds(), noise)
    assert limits.max_logprob_drift == limit and limits.near_tie_tolerance == 0.03
