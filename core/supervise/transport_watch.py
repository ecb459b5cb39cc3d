"""Watch the engines' logs for UCX's protocol report and name a GPU-memory transfer that fell back to TCP.

launch sets UCX_PROTO_INFO=y on CUDA (placement.py), so each server's log holds UCX's protocol tables once its
first NIXL transfer has run. A thread re-reads the new part of each engine log every few seconds and calls
`warn` once per log whose GPU-memory reads or writes go over TCP instead of cuda_ipc.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from hybridserve.core.common.ucx import fallback_message, parse_proto_info


class TransportWatch:
    """`with TransportWatch({name: log_path}, warn=print): ...` (a daemon thread; stops on exit)."""

    def __init__(self, logs: dict[str, Path], *, warn: Callable[[str], None], period_s: float = 5.0) -> None:
        self._logs, self._warn, self._period = dict(logs), warn, period_s
        self._offsets = {name: 0 for name in logs}
        self._tail = {name: "" for name in logs}
        self._tables = {name: [] for name in logs}  # UCX table lines seen so far (a table may span two reads)
        self.warned: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="hybridserve-transport-watch")

    def __enter__(self) -> TransportWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=self._period + 1)
        self.check()  # a last look at what arrived since

    def _loop(self) -> None:
        while not self._stop.wait(self._period):
            self.check()

    def check(self) -> None:
        for name, path in self._logs.items():
            if name in self.warned:
                continue
            try:
                with open(path, "rb") as log:
                    log.seek(self._offsets[name])
                    chunk = log.read().decode(errors="replace")
                    self._offsets[name] = log.tell()
            except OSError:
                continue
            text = self._tail[name] + chunk
            cut = text.rfind("\n") + 1  # parse whole lines; keep a partial last line for next time
            self._tail[name] = text[cut:]
            self._tables[name] += [line for line in text[:cut].splitlines() if "|" in line]
            message = fallback_message(name, parse_proto_info("\n".join(self._tables[name])))
            if message:
                self.warned.add(name)
                self._warn(message)
