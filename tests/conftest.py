"""Session set-up shared by all tests.

`make test` runs the files that start vLLM servers in one process, one after another: two P/D deployments at once
put four servers on two cores (requests crawl, NIXL leases expire; a CI flake in zero_after_transfer was seen that
way). The NIXL agent files (marked `nixl_agents`: agents only, no vLLM server, their own ports) run beside them in a
second pytest process, after the tests that start no server. The `xdist_group` marks serve `SLOW_JOBS=2`
(`--dist loadgroup`), not the default: pytest-xdist 3.8 was seen splitting the `vllm_servers` group.
"""


def pytest_collection_modifyitems(config, items):
    """Tests marked `run_first` come first (the order is otherwise kept): the longest server file starts at once."""
    items.sort(key=lambda item: item.get_closest_marker("run_first") is None)
