"""Session set-up shared by all tests.

Under `make test` the slow files run on two xdist workers by group (`--dist loadgroup`): every file that starts
vLLM servers carries `xdist_group("vllm_servers")` and runs on one worker, one after another, because two P/D
deployments at once put four servers on two cores (requests crawl, NIXL leases expire; a CI flake in
zero_after_transfer was seen that way). The NIXL transfer files (`xdist_group("nixl_agents")`: agents only, bursty)
run beside them on the other worker.
"""


def pytest_collection_modifyitems(config, items):
    """Tests marked `run_first` come first (the order is otherwise kept): the longest server file starts at once."""
    items.sort(key=lambda item: item.get_closest_marker("run_first") is None)
