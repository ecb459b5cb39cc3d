"""One timeline file of a deployment: every process appends one JSON line per event (the plugin's hooks inside vLLM,
core/vllm_plugin/timeline.py; the proxy's hops, core/proxy), stamped with `time.time()` so that lines of
different processes on one host compare. Off unless TIMELINE_FILE_ENV names the file. One `os.write` of one line
each, O_APPEND: lines of concurrent writers never interleave. The reader: core/chaos/timeline_gaps.py.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from hybridserve.core.common.contracts import TIMELINE_FILE_ENV

_fd: list[int] = []


def path_from_env(env: dict[str, str] | None = None) -> str | None:
    return ((os.environ if env is None else env).get(TIMELINE_FILE_ENV) or "").strip() or None


def open_file(path: str) -> None:
    if not _fd:
        _fd.append(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644))


def emit(event: str, req: str, **fields: Any) -> None:
    """Append one event line; does nothing when no file is open (the timeline is off)."""
    if not _fd:
        return
    line = json.dumps({"t": time.time(), "pid": os.getpid(), "event": event, "req": req, **fields})
    try:
        os.write(_fd[0], (line + "\n").encode())
    except OSError:
        pass
