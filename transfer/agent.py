"""One NIXL agent per rank: a unique name per incarnation, UCX, a progress thread that sleeps, quiet logs.

Everything the agent acquires (registrations, prepared descriptor lists, remote agents) is recorded with its
release call and released in reverse order by `close()` (the agent is a context manager), or earlier, one by
one, through `release(key)`.
"""

from __future__ import annotations

import itertools
import logging
import os
import secrets
from collections.abc import Callable
from typing import Any

from hybridserve.core.common.errors import CouldNotRunError, MissingExtraError
from hybridserve.core.common.nixl_delay import DEFAULT_PROGRESS_DELAY_US, create_agent

log = logging.getLogger(__name__)



def import_nixl() -> Any:
    """nixl's Python API, with its INFO logging off unless the caller set NIXL_LOG_LEVEL."""
    os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")
    try:
        import nixl._api as api
    except ImportError:
        raise MissingExtraError("nixl", "cpu", "NIXL transfer") from None
    return api


def incarnation_name(role: str, rank: int) -> str:
    """Unique per process start: a restarted peer never reuses the name its predecessor left in our metadata."""
    return f"{role}{rank}-{os.getpid()}-{secrets.token_hex(3)}"


class Agent:
    """A NIXL agent with the UCX backend; `progress_delay_us=None` runs without a progress thread."""

    def __init__(self, *, role: str, rank: int, progress_delay_us: int | None = DEFAULT_PROGRESS_DELAY_US,
                 telemetry: bool = False, num_threads: int = 0, thread_safe: bool = True) -> None:
        api = import_nixl()
        self.name = incarnation_name(role, rank)
        self._releases: dict[int, tuple[str, Callable[[], None]]] = {}
        self._keys = itertools.count()
        self.inbox: list[tuple[str, bytes]] = []  # notifications not yet claimed by a waiter
        config = api.nixl_agent_config(enable_prog_thread=progress_delay_us is not None, enable_listen_thread=False,
                                       capture_telemetry=telemetry, num_threads=num_threads, backends=["UCX"],
                                       # reader-writer locking: transfers may be posted from several threads
                                       sync_mode=api.nixl_thread_sync_t.NIXL_THREAD_SYNC_RW if thread_safe else None)
        try:
            self.nixl = create_agent(api, self.name, config, progress_delay_us or 0)
        except Exception as exc:  # nixlBackendError etc.: UCX could not start
            raise CouldNotRunError(f"NIXL agent {self.name}: UCX backend did not start ({type(exc).__name__}: "
                                   f"{exc}); check UCX_TLS (never empty) and NIXL_PLUGIN_DIR") from None

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _hold(self, what: str, release: Callable[[], None]) -> int:
        key = next(self._keys)
        self._releases[key] = (what, release)
        return key

    def release(self, key: int) -> None:
        """Release one held resource now (idempotent)."""
        entry = self._releases.pop(key, None)
        if entry is not None:
            entry[1]()

    def close(self) -> None:
        """Release everything still held, newest first; keep going past failures (they are logged)."""
        for key in sorted(self._releases, reverse=True):
            what, release = self._releases.pop(key)
            try:
                release()
            except Exception as exc:  # a dead peer makes some releases fail; the rest must still go
                log.warning("%s: releasing %s failed: %s: %s", self.name, what, type(exc).__name__, exc)

    def register(self, tensors: list[Any]) -> int:
        """Register contiguous tensors (DRAM or VRAM, one region each) in one call; returns the release key."""
        reg = self.nixl.register_memory(tensors)
        return self._hold("registration", lambda: self.nixl.deregister_memory(reg))

    def prep(self, peer: str | None, rows: Any, mem: str) -> tuple[Any, int]:
        """Prepare a descriptor list: local when `peer` is None, else against `peer`'s registered memory.

        `rows` is an Nx3 (address, length, device) or Nx5 strided (address, length, device, stride, count)
        uint64 array. Returns (handle, release key).
        """
        handle = self.nixl.prep_xfer_dlist("NIXL_INIT_AGENT" if peer is None else peer, rows, mem)
        return handle, self._hold("descriptor list", handle.release)

    def add_peer(self, metadata: bytes) -> tuple[str, int]:
        """Load a peer's metadata; returns (its agent name, release key)."""
        name = self.nixl.add_remote_agent(metadata)
        name = name.decode() if isinstance(name, bytes) else str(name)
        return name, self._hold(f"peer {name}", lambda: self.nixl.remove_remote_agent(name))
