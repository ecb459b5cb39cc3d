"""validate end to end against fake OpenAI-compatible servers (FastAPI + uvicorn in this process).

The fake "model" answers the synthetic prompts correctly and can be told to diverge: wrong words with a
clear margin (a regression), wrong words at a near-tie (forgiven), or shifted logprobs (drift).
"""

from collections import Counter
from dataclasses import replace
import xml.etree.ElementTree as ET

import pytest
from typer.testing import CliRunner

fastapi = pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")

from _app_threads import served_apps  # noqa: E402
from hybridserve.cli.app import app  # noqa: E402
from hybridserve.core.common.errors import CouldNotRunError, InputError  # noqa: E402
from hybridserve.core.validate import ValidateRequest, load_dataset, parse_target, validate  # noqa: E402


def fake_app(mode: str):
    api = fastapi.FastAPI()

    @api.get("/v1/models")
    def models():
        return {"object": "list", "data": [{"id": "fake", "object": "model"}]}

    @api.post("/v1/completions")
    def completions(body: dict):
        words = body["prompt"].split()[:-1]
        markers = [t for t in words if t.startswith("S")]
        is_even = int(words[0][1:]) % 2 == 0  # about half of the prompts (the first token is a word or a marker)
        if mode == "error" and is_even:  # like vLLM on NaN logprobs
            raise fastapi.HTTPException(400, "Out of range float values are not JSON compliant")
        tokens = ([Counter(markers).most_common(1)[0][0], markers[-1]] + ["."] * 16)[: body["max_tokens"]]
        logprobs, gaps = [-0.01] * len(tokens), [4.0] * len(tokens)
        right = tokens[0]
        if is_even:
            if mode in ("diverge", "moved"):
                tokens = ["S99"] + tokens[1:]
            if mode == "flat":  # right, but the best two tokens were nearly tied at the first position
                gaps[0] = 0.001
        if mode == "drift":
            logprobs = [-0.5] * len(tokens)
        top = [{t: lp, "w000": lp - g} for t, lp, g in zip(tokens, logprobs, gaps)]
        if is_even and mode == "diverge":  # the right word stays a close second: it moved like noise
            top[0][right] = logprobs[0] - 0.0005  # ("moved": it left the top-k, at least 4 below)
        return {"choices": [{"text": " " + " ".join(tokens), "logprobs": {
            "tokens": tokens, "token_logprobs": logprobs, "top_logprobs": top}}]}

    return api


@pytest.fixture(scope="module")
def servers():
    """One fake server per mode, each on a free port; stopped at the end of the module."""
    with served_apps({mode: fake_app(mode) for mode in ("good", "diverge", "moved", "flat", "drift", "error")}) as urls:
        yield urls


def run(base_url, cand_url, num=16):
    return validate(ValidateRequest(baseline=parse_target(base_url, what="baseline"),
                                    candidate=parse_target(cand_url, what="candidate"),
                                    dataset=load_dataset("synthetic", num_prompts=num, seed=1)))


def test_identical_servers_pass(servers):
    report = run(servers["good"], servers["good"])
    m = report.verdict.metrics
    assert report.verdict.passed
    assert m.baseline_accuracy == 1.0 and m.candidate_accuracy == 1.0 and m.token_agreement == 1.0


def test_divergent_candidate_fails_and_names_metrics(servers):
    report = run(servers["good"], servers["diverge"])
    m = report.verdict.metrics
    assert not report.verdict.passed
    assert m.candidate_accuracy < 1.0 and set(m.divergence_positions) == {0}
    assert {c.metric for c in report.verdict.failures} >= {"accuracy_drop", "token_agreement"}


def test_near_ties_of_the_baseline_are_forgiven_but_accuracy_still_counts(servers):
    report = run(servers["flat"], servers["diverge"])
    m = report.verdict.metrics
    assert m.token_agreement == 1.0 and m.num_near_tie_prompts > 0 and m.num_divergent_prompts == 0
    assert [c.metric for c in report.verdict.failures] == ["accuracy_drop"]
    # the candidate's own doubt does not excuse it: a flat candidate against a sure baseline is not a near-tie
    assert run(servers["good"], servers["diverge"]).verdict.metrics.num_near_tie_prompts == 0
    # nor does the baseline's: a flip where the candidate moved the baseline's word far (out of its top-k) is not
    moved = run(servers["flat"], servers["moved"]).verdict.metrics
    assert moved.num_near_tie_prompts == 0 and moved.num_divergent_prompts > 0 and moved.token_agreement < 1.0


def test_logprob_drift_alone_fails(servers):
    report = run(servers["good"], servers["drift"])
    assert [c.metric for c in report.verdict.failures] == ["mean_logprob_drift"]
    assert report.verdict.metrics.mean_logprob_drift == pytest.approx(0.49)


def test_candidate_refusing_prompts_is_a_regression(servers):
    report = run(servers["good"], servers["error"])
    m = report.verdict.metrics
    assert 0 < m.num_failed_requests < m.num_prompts
    assert "failed_requests" in {c.metric for c in report.verdict.failures}
    assert m.candidate_accuracy == 1 - m.num_failed_requests / m.num_prompts


def test_baseline_answers_of_an_earlier_report_are_not_asked_again(servers):
    first = run(servers["good"], servers["diverge"])
    request = ValidateRequest(baseline=parse_target("http://127.0.0.1:9", what="baseline"),  # nobody listens there
                              candidate=parse_target(servers["diverge"], what="candidate"),
                              dataset=load_dataset("synthetic", num_prompts=16, seed=1),
                              baseline_answers=first.baseline_answers)
    again = validate(request)
    assert len(first.baseline_answers) == 16 and again.verdict.metrics == first.verdict.metrics
    with pytest.raises(InputError, match="baseline answers: 15 given for 16 prompts"):
        validate(replace(request, baseline_answers=first.baseline_answers[1:]))


def test_baseline_refusing_prompts_could_not_run(servers):
    with pytest.raises(CouldNotRunError, match="baseline .* prompts failed; first: .*HTTP 400"):
        run(servers["error"], servers["good"])


def test_unreachable_endpoint_could_not_run(servers):
    with pytest.raises(CouldNotRunError, match="127.0.0.1:9"):
        run(servers["good"], "http://127.0.0.1:9", num=2)


@pytest.mark.parametrize("seen, is_ok", [("AsyncScheduler (async_scheduling=True)", True),
                                          ("Scheduler (async_scheduling=False)", False)], ids=["async", "sync"])
def test_a_configuration_is_started_served_by_name_and_its_scheduler_proven(servers, tmp_path, monkeypatch, seen,
                                                                            is_ok):
    """validate's own start of a configuration (the CLI's default candidate), with `deployed` patched: the exact
    arguments it gets, prompts sent under the model folder's name, the scheduler read from the engine logs."""
    from contextlib import contextmanager

    from hybridserve.core.validate import validation as run_module
    from hybridserve.core.deployments.target import Config
    from hybridserve.core.deployments.deployed import Deployment

    log = tmp_path / "decode-0.log"
    log.write_text(f"(EngineCore pid=1) INFO hybridserve: engine scheduler {seen}\n")
    calls, models = [], []

    @contextmanager
    def fake_deployed(target, **kwargs):
        calls.append((target, kwargs))
        yield Deployment(url=servers["good"], run_dir=tmp_path, engine_logs=(log,))

    real_complete_all = run_module.complete_all
    monkeypatch.setattr(run_module, "deployed", fake_deployed)
    monkeypatch.setattr(run_module, "complete_all",
                        lambda url, prompts, settings, on_done: models.append(settings.model) or real_complete_all(
                            url, prompts, settings, on_done))
    model = tmp_path / "my-model"
    request = ValidateRequest(baseline=parse_target(servers["good"], what="baseline"),
                              candidate=parse_target("pd-async", what="candidate"),
                              dataset=load_dataset("synthetic", num_prompts=2, seed=1), model=model, base_port=9100,
                              run_root=tmp_path / "runs", num_cores=2, start_timeout_s=33.0)
    if not is_ok:
        with pytest.raises(CouldNotRunError, match="pd-async: decode-0.log shows scheduler 'Scheduler', expected "
                                                   "'AsyncScheduler'"):
            validate(request)
        return
    report = validate(request)
    (base, _), (target, kwargs) = calls  # in order: the baseline (a URL: nothing to start), the candidate
    assert base.url == servers["good"] and base.config is None
    assert target.config is Config.PD_ASYNC and target.fault is None
    assert kwargs == dict(model=model.resolve(), base_port=9100, run_root=(tmp_path / "runs").resolve(), num_cores=2,
                          timeout_s=33.0, device="cpu", engine=None)
    assert models == [None, "my-model"]  # a URL is asked as it names its model; a started folder by its name
    assert report.candidate.schedulers == {"decode-0": "AsyncScheduler"} and report.verdict.passed


def test_cli_exit_codes_json_and_junit(servers, tmp_path):
    runner = CliRunner()
    junit = tmp_path / "v.xml"
    args = ["validate", "--baseline", servers["good"], "--num-prompts", "8", "--junit", str(junit), "--json"]
    ok = runner.invoke(app, [*args, "--candidate", servers["good"]])
    assert ok.exit_code == 0, ok.output
    assert '"passed": true' in ok.stdout
    assert ET.parse(junit).getroot().get("failures") == "0"
    bad = runner.invoke(app, [*args, "--candidate", servers["diverge"]])
    assert bad.exit_code == 1
    suite = ET.parse(junit).getroot()
    failed = {c.get("name") for c in suite.iter("testcase") if c.find("failure") is not None}
    assert "accuracy_drop" in failed and int(suite.get("failures")) == len(failed)
    down = runner.invoke(app, ["validate", "--baseline", servers["good"], "--candidate", "http://127.0.0.1:9",
                               "--num-prompts", "2"])
    assert down.exit_code == 2 and "127.0.0.1:9" in down.output


def test_cli_refuses_bad_input():
    runner = CliRunner()
    for args, needle in [(["--candidate", "pd-fast"], "accepted"), (["--dataset", "nope.txt"], "synthetic"),
                         (["--fault", "melt"], "early_completion"), (["--max-tokens", "0"], "at least 1"),
                         (["--baseline", "http://x:1", "--fault", "stale_state", "--candidate", "http://y:1"],
                          "configuration")]:
        result = runner.invoke(app, ["validate", *args])
        assert result.exit_code == 2, (args, result.output)
        assert needle in result.output
