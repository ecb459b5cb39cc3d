"""Which engines launch is still warming up (core/launch/warmup.py): a contract between launch and the proxy.

launch writes `WARM_FILE` in the run folder (the proxy's working directory), one JSON object of engine URL ->
WARMING or WARM, replaced whole on every change. The proxy (`--warm-file`) keeps an engine that answers /health but
is WARMING out of its routing, so a restarted engine gets no client request before its warm-up burst is done. An
engine the file does not name, or no file at all (a proxy started alone, `launch --role proxy`), is judged by its
/health only.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

from hybridserve.core.common import atomic_file
from hybridserve.core.common.contracts import WARM, WARM_FILE, WARMING  # noqa: F401 (the names of the contract)

_WRITING = threading.Lock()  # launch sets states from its restart threads


def read_warm_state(path: Path) -> dict[str, str]:
    """URL -> WARMING / WARM; empty when the file is missing or unreadable (then /health alone decides)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return {str(url): str(state) for url, state in data.items()} if isinstance(data, dict) else {}


def write_warm_state(path: Path, url: str, state: str) -> None:
    """Set one engine's state, keeping the others'."""
    with _WRITING:
        states = read_warm_state(path)
        states[url] = state
        atomic_file.write_text(Path(path), json.dumps(states, indent=1, sort_keys=True) + "\n")
