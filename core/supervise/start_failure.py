"""Why an engine stopped before it was healthy, from its log: the root error line vLLM wrote (not its last lines, which
are tracebacks and shutdown warnings), and what it means where the project has measured it.

vLLM's API server ends a failed start with "RuntimeError: Engine core initialization failed. See root cause above";
the cause is an earlier line of the engine core, such as vllm/v1/worker/utils.py `request_memory`'s "ValueError: Free
memory on device cuda:0 (17.98/139.8 GiB) on startup is less than desired GPU memory utilization (0.45, 62.91 GiB)".
"""

from __future__ import annotations

import re
from pathlib import Path

TAIL_BYTES = 256 * 1024  # a failed start's traceback sits in the last part of the log
_ERROR_LINE = re.compile(r"(?:\(\w+ pid=\d+\)\s*)?(?:ERROR [\d-]+ [\d:]+ \[[^\]]*\]\s*)?"
                         r"(?P<error>[A-Z]\w*(?:Error|Exception)): (?P<message>.+)$")
_NOT_THE_CAUSE = ("root cause above", "Failed core proc")
_FREE_MEMORY = re.compile(r"Free memory on device (?P<device>\S+) \((?P<free>[\d.]+)/(?P<total>[\d.]+) GiB\) on "
                          r"startup is less than desired GPU memory utilization \((?P<share>[\d.]+), "
                          r"(?P<want>[\d.]+) GiB\)")
# measured on the H200 (2026-12-04, benchmarks/HISTORY.md "Role deaths under load (chaos), H200"): after prefill's
# SIGKILL its decode peer, which had READ prefill's KV over cuda_ipc, held prefill's memory; a NIXL initiator holds a dead
# target's memory until it exits (UCX's default: "A dead engine's GPU memory, held by its NIXL peer (H200)")
_STATE_BLOCKS = re.compile(r"max_num_seqs \((?P<seqs>\d+)\) exceeds available Mamba cache blocks \((?P<blocks>\d+)\)")
HELD_BY_PEER = ("other processes hold the rest; a NIXL peer that read a dead engine's KV cache over cuda_ipc keeps "
                "that memory until the peer itself exits")


def root_error(log_path: Path, start: int = 0) -> str | None:
    """The last error line of the log from byte `start` on (a restart appends to its role's log: an earlier run's
    error is not this start's) that names a cause, without vLLM's prefixes; None when there is none."""
    try:
        with open(log_path, "rb") as log:
            log.seek(0, 2)
            log.seek(max(start, log.tell() - TAIL_BYTES))
            text = log.read().decode(errors="replace")
    except OSError:
        return None
    found = None
    for line in text.splitlines():
        m = _ERROR_LINE.search(line.strip())
        if m and not any(s in m.group("message") for s in _NOT_THE_CAUSE):
            found = f"{m.group('error')}: {m.group('message').strip()}"
    return found


def explain(error: str) -> str:
    """The error, and what it means where that is known."""
    blocks = _STATE_BLOCKS.search(error)
    if blocks is not None:  # vLLM's CUDA graph check for hybrid models (seqs_fit.py): its own count, exact
        return (f"{error} (launch: --max-num-seqs {blocks.group('blocks')} fits this engine's memory; its GDN state "
                "takes one block per sequence)")
    m = _FREE_MEMORY.search(error)
    if m is None:
        return error
    return (f"{m.group('device')} had {m.group('free')} of {m.group('total')} GiB free, less than this engine's share "
            f"({m.group('share')}, {m.group('want')} GiB): {HELD_BY_PEER}")


def start_failure(log_path: Path, start: int = 0) -> str | None:
    """One line: why the engine whose log this is stopped before it was healthy; None when its log does not say."""
    error = root_error(log_path, start)
    return None if error is None else f"vLLM: {explain(error)}"
