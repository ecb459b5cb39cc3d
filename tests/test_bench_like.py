"""Issue 38's acceptance on CPU with real servers: bench against two servers that differ in max-num-seqs says so
before any number. The session's plain server (conftest.py `single_sync_baseline`: 8 sequences) and one more of the
same model with 4, started in the same run root: bench reads both from their launch plans, logs and /metrics,
refuses them (exit 2, one line, no request sent), and with --allow-unlike measures them and marks the difference
first. One short request each: CI has 2 cores."""

import json
import os
import re

import pytest

pytest.importorskip("vllm")
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("vllm_servers")]  # see tests/conftest.py

from typer.testing import CliRunner  # noqa: E402

from hybridserve.cli.app import app  # noqa: E402
from hybridserve.core.launch.topology import EngineOptions  # noqa: E402
from hybridserve.core.validate import parse_target  # noqa: E402
from hybridserve.core.deployments.target import RECALL_MODEL_DIR  # noqa: E402
from hybridserve.core.deployments.deployed import deployed

ONE_REQUEST = ["--model", str(RECALL_MODEL_DIR), "--input-len", "48", "--output-len", "6", "--num-requests", "1"]


@pytest.fixture(scope="module")
def four_seqs(single_sync_baseline):
    """The baseline's server again, but --max-num-seqs 4, in the baseline's run root (bench finds both there)."""
    with deployed(parse_target("single-sync", what="x"), model=RECALL_MODEL_DIR, base_port=18300,
                  run_root=single_sync_baseline.run_dir.parent, num_cores=os.cpu_count() or 1, timeout_s=420,
                  engine=EngineOptions(max_num_seqs=4)) as started:
        yield started


def _bench(four_seqs, baseline, *more):
    return CliRunner().invoke(app, ["bench", "--deployment", four_seqs.url, "--baseline", baseline.url,
                                    "--run-dir", str(baseline.run_dir.parent), *ONE_REQUEST, *more])


def _requests_served(url):
    import httpx

    text = httpx.get(f"{url}/metrics").text
    return sum(float(v) for v in re.findall(r'^vllm:request_success_total\{[^}]*\} (\S+)', text, re.MULTILINE))


def test_unlike_servers_are_refused_before_any_request(four_seqs, single_sync_baseline):
    before = [_requests_served(t.url) for t in (four_seqs, single_sync_baseline)]
    result = _bench(four_seqs, single_sync_baseline, "--json")
    assert result.exit_code == 2, result.output
    assert result.stdout == ""  # no number, no JSON
    (line,) = [line for line in result.stderr.splitlines() if line.strip()]
    assert "max-num-seqs 4 (deployment) vs 8 (baseline)" in line and "--allow-unlike" in line
    assert [_requests_served(t.url) for t in (four_seqs, single_sync_baseline)] == before


def test_allowed_they_are_measured_and_marked_first(four_seqs, single_sync_baseline):
    result = _bench(four_seqs, single_sync_baseline, "--allow-unlike", "--gpus", "1", "--slo-ttft", "60000",
                    "--slo-itl", "60000", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    likeness = report["settings"]["likeness"]
    assert likeness["differences"] == [{"setting": "max-num-seqs", "values": {"deployment": "4", "baseline": "8"}}]
    assert likeness["lines"][0] == "UNLIKE: max-num-seqs 4 (deployment) vs 8 (baseline)"
    for role in ("deployment", "baseline"):
        values = report["settings"]["targets"][role]["values"]
        assert values["max-model-len"] == "2048" and values["enforce-eager"] == "on"
        assert values["async-scheduling"] == "off" and values["memory"] == "KV cache 1 GiB per engine"
        (engine,) = report["settings"]["targets"][role]["engines"].values()
        assert engine["async-scheduling"]["source"] == "log" and engine["memory"]["source"] == "metrics"
    for target in report["targets"]:
        client = target["phases"][0]["client"]
        assert target["num_gpus"] == 1 and client["num_ok"] == client["num_good"] == 1
        assert client["output_throughput_per_gpu"] == pytest.approx(client["output_throughput"])
        assert client["total_throughput"] == pytest.approx((48 + 6) / client["wall_s"])

    table = _bench(four_seqs, single_sync_baseline, "--allow-unlike")
    assert table.exit_code == 0, table.output
    assert table.stdout.splitlines()[0] == "UNLIKE: max-num-seqs 4 (deployment) vs 8 (baseline)"
