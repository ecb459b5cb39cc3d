"""Session set-up shared by all tests."""


def pytest_collection_modifyitems(config, items):
    """Tests marked `run_first` come first (the order is otherwise kept). Under `make test` the slow files run one
    per worker, handed out in this order (`--no-loadscope-reorder`): the longest file starts at once instead of
    waiting behind shorter ones."""
    items.sort(key=lambda item: item.get_closest_marker("run_first") is None)
