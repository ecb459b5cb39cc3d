"""Ranks as processes: one process per prefill or decode rank, driven over a pipe with a deadline per call.

The driver never waits without a deadline; on any failure the `RankGroup` context manager kills every child.
A child exits on its own when the driver's pipe closes or the driver process disappears.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import threading
import time
from typing import Any

from hybridserve.core.common.errors import CouldNotRunError
from hybridserve.transfer.errors import TransferError, TransferTimeout

_PRELOAD = ["torch", "numpy", "hybridserve.transfer.workers"]


def _context() -> Any:
    """forkserver with torch preloaded: children start in ~0.1 s instead of importing torch each."""
    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(_PRELOAD)
        return ctx
    return mp.get_context("spawn")


def _child(conn: Any, role: str, rank: int, options: dict[str, Any], driver_pid: int) -> None:
    os.environ.update(options.pop("env", None) or {})  # before the NIXL agent starts: UCX reads it once
    stdout_path = options.pop("stdout_path", None)
    if stdout_path:  # UCX prints its protocol report to stdout
        fd = os.open(stdout_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.close(fd)
    from hybridserve.transfer import workers

    def watch() -> None:  # the forkserver is our parent; watch the driver itself
        while True:
            try:
                os.kill(driver_pid, 0)
            except OSError:
                os._exit(3)
            time.sleep(0.5)

    threading.Thread(target=watch, daemon=True).start()
    worker = workers.make(role, rank, **options)
    try:
        while True:
            try:
                cmd, kwargs = conn.recv()
            except (EOFError, OSError):
                return
            if cmd == "exit":
                conn.send(("ok", None))
                return
            try:
                conn.send(("ok", getattr(worker, cmd)(**kwargs)))
            except Exception as exc:  # reported to the driver, which raises it there
                conn.send(("err", _portable(exc)))
    finally:
        worker.close()


def _portable(exc: Exception) -> Exception:
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return CouldNotRunError(f"{type(exc).__name__}: {exc}")


class RankProcess:
    def __init__(self, ctx: Any, role: str, rank: int, **options: Any) -> None:
        self.name = f"{role}{rank}"
        self._conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_child, args=(child, role, rank, options, os.getpid()), daemon=True,
                                   name=f"hybridserve-{self.name}")
        self.process.start()
        child.close()
        self._pending: str | None = None

    def send(self, cmd: str, **kwargs: Any) -> None:
        self._pending = cmd
        self._conn.send((cmd, kwargs))

    def result(self, wait_s: float) -> Any:
        cmd = self._pending or "?"
        try:
            if not self._conn.poll(wait_s):
                raise TransferTimeout(peer=self.name, phase=cmd, timeout_s=wait_s)
            status, value = self._conn.recv()
        except (EOFError, OSError):
            self.process.join(timeout=1)
            raise TransferError(peer=self.name, phase=cmd,
                                detail=f"rank process ended (exit code {self.process.exitcode})") from None
        self._pending = None
        if status == "err":
            raise value
        return value

    def call(self, cmd: str, wait_s: float, **kwargs: Any) -> Any:
        self.send(cmd, **kwargs)
        return self.result(wait_s)

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=5)

    def close(self, timeout_s: float = 10.0) -> None:
        try:
            if self.process.is_alive() and self._pending is None:
                self.call("exit", timeout_s)
        except Exception:
            pass
        self.process.join(timeout=timeout_s)
        self.kill()


class RankGroup:
    """Starts ranks; on exit closes them (or kills them all when leaving on an error)."""

    def __init__(self) -> None:
        self._ctx = _context()
        self.ranks: list[RankProcess] = []

    def start(self, role: str, rank: int, **options: Any) -> RankProcess:
        proc = RankProcess(self._ctx, role, rank, **options)
        self.ranks.append(proc)
        return proc

    def __enter__(self) -> RankGroup:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        for proc in self.ranks:
            if exc_type is None:
                proc.close()
            else:
                proc.kill()
        for proc in self.ranks:
            proc.kill()
