"""The decode-side NIXL worker's per-step result call, across vLLM versions.

vLLM 0.32's `NixlPullConnectorWorker.get_transfer_results()` returns an object with `finished_recving` and
`failed_recving`; vLLM 0.26 has no such method: `get_finished()` returns `(done_sending, done_recving)`, failed
receives included in done_recving (nixl/base_worker.py). The plugin's patches wrap whichever exists.
"""

from __future__ import annotations

from typing import Any

NEW, OLD = "get_transfer_results", "get_finished"


def results_method(worker_cls: Any) -> str:
    return NEW if hasattr(worker_cls, NEW) else OLD


def finished_recving(out: Any) -> set[str]:
    found = getattr(out, "finished_recving", None)
    if found is None and isinstance(out, tuple) and len(out) == 2:
        found = out[1]
    return set(found or ())


def failed_recving(out: Any) -> set[str]:
    return set(getattr(out, "failed_recving", None) or ())
