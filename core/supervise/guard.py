"""Role processes die with the launcher, even when the launcher is killed with SIGKILL.

Two mechanisms, because one is not enough for vLLM:

- Each role's process group leader asks the kernel for a parent-death signal (`prctl(PR_SET_PDEATHSIG)`), so the
  API server gets SIGTERM the moment the launcher is gone. A wrapper sets it and then execs the role's command
  (`python -m hybridserve.core.supervise.guard --exec LAUNCHER_PID ARGV...`; the signal survives exec, the pid stays
  the same); a `preexec_fn` would run Python in a child forked while the launcher's progress thread may hold a
  lock. The leader's children (vLLM's engine core and workers) are not covered: their parent is the API server.
- A guard process per run (`python -m hybridserve.core.supervise.guard`, in its own session) holds the read end of
  a pipe whose only write end is the launcher's. The launcher sends the process group id of each role it starts,
  and `done` once it has stopped them itself. End of file without `done` means the launcher died: the guard
  sends SIGTERM to every group, waits a short grace period, then SIGKILLs what is left, and exits.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
GRACE_S = 3.0
DONE = "done"


def _load_prctl():  # noqa: ANN202
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux: the guard process still covers the roles
        return None


_PRCTL = _load_prctl()


def wrapped(argv: tuple[str, ...] | list[str], python: str | None = None) -> list[str]:
    """The command line that runs `argv` with a parent-death signal set."""
    return [python or sys.executable, "-m", __name__, "--exec", str(os.getpid()), *argv]


def exec_with_parent_death(launcher_pid: int, argv: list[str]) -> None:
    """Ask for SIGTERM when the parent (the launcher) dies, then become `argv`."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    if os.getppid() != launcher_pid:  # the launcher died before prctl took effect
        sys.exit(1)
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        sys.exit(f"cannot start {argv[0]} ({exc.strerror})")


class Guard:
    """The launcher's side: start the guard, tell it each role's group, release it after a clean stop."""

    def __init__(self, python: str | None = None) -> None:
        read_end, self._write_end = os.pipe()
        try:
            self.popen = subprocess.Popen([python or sys.executable, "-m", __name__], stdin=read_end,
                                          stdout=subprocess.DEVNULL, start_new_session=True, close_fds=True)
        finally:
            os.close(read_end)

    def watch(self, pgid: int) -> None:
        self._send(f"{pgid}\n")

    def release(self) -> None:
        """Every role is stopped: the guard exits without touching anything."""
        self._send(f"{DONE}\n")
        self._close()
        try:
            self.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.popen.kill()

    def _send(self, line: str) -> None:
        if self._write_end is not None:
            try:
                os.write(self._write_end, line.encode())
            except BrokenPipeError:  # the guard was killed: the launcher still stops its roles itself
                self._close()

    def _close(self) -> None:
        if self._write_end is not None:
            os.close(self._write_end)
            self._write_end = None


def kill_groups(pgids: list[int], *, grace_s: float = GRACE_S) -> None:
    """SIGTERM every group, wait until they are gone or `grace_s` passed, SIGKILL what is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not wait_groups_gone([pgid for pgid in pgids if _signal_group(pgid, sig)], timeout_s=grace_s):
            return


def wait_groups_gone(pgids: list[int], *, timeout_s: float) -> list[int]:
    """Wait until no process is left in these groups (or the timeout passed); return the groups still alive."""
    alive = [pgid for pgid in pgids if _signal_group(pgid, 0)]
    deadline = time.monotonic() + timeout_s
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [pgid for pgid in alive if _signal_group(pgid, 0)]
    return alive


def _signal_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def main() -> None:
    """The guard: read group ids until `done` (exit) or end of file (the launcher died: kill the groups)."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # a Ctrl-C meant for the launcher must not take the guard first
    pgids: list[int] = []
    for line in sys.stdin:
        word = line.strip()
        if word == DONE:
            return
        if word.isdigit():
            pgids.append(int(word))
    kill_groups(pgids)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--exec"]:
        exec_with_parent_death(int(sys.argv[2]), sys.argv[3:])
    else:
        main()
