"""Session set-up shared by all tests."""

import pytest

# Slow files that start real vLLM servers (two pinned to the two cores per deployment). Two such files side by side
# put four servers on two cores: requests crawl and NIXL leases expire (a CI flake in zero_after_transfer was seen
# that way). So under `make test` they share one xdist group (one worker, one file after another), while the NIXL
# transfer files (agents only, bursty) run beside them on the other worker.
VLLM_SERVER_FILES = {"test_validate_pd.py", "test_launch_pd.py", "test_gdn_dispatch_server.py"}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Tests marked `run_first` come first (the order is otherwise kept): the longest server file starts at once.
    Slow tests get their xdist group: vLLM-server files one after another, NIXL transfer files beside them."""
    items.sort(key=lambda item: item.get_closest_marker("run_first") is None)
    for item in items:
        if item.get_closest_marker("slow") is None:
            continue
        group = "vllm_servers" if item.path.name in VLLM_SERVER_FILES else "nixl_agents"
        item.add_marker(pytest.mark.xdist_group(group))
