"""Free TCP ports for the tests' servers, picked below the kernel's ephemeral range where the box leaves room.

A port the kernel hands out for bind(0) is ephemeral: until the server binds it (seconds later for a vLLM server,
which imports vLLM first), any client connection of another test may take it as its local port. Between 20000 and
the range's start (32768 on a stock Linux) the kernel hands out nothing, and Ray's workers (10002-19999) stay below:
there a port checked free stays free unless another test picks it too. Where the range leaves no room (it starts
below 22000), the kernel's pick, as before.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

LOWEST = 20000  # above Ray's default worker ports (10002-19999)
ROOM = 2000  # the least span worth picking from
TRIES = 200


def ephemeral_start() -> int | None:
    """The first port of the kernel's ephemeral range (net.ipv4.ip_local_port_range), or None where unreadable."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _span(top_offset: int = 0) -> range | None:
    start = ephemeral_start()
    if start is None or start - top_offset - LOWEST < ROOM:
        return None
    return range(LOWEST, start - top_offset)


def _bound(host: str, port: int) -> socket.socket | None:
    sock = socket.socket()
    try:
        sock.bind((host, port))
        return sock
    except OSError:
        sock.close()
        return None


def free_ports(host: str, n: int) -> list[int]:
    """n distinct free ports of `host`: every socket stays bound until all are picked (one at a time, the same port
    could come out twice, and launch refuses a topology that names a port twice)."""
    span, socks = _span(), []
    try:
        for _ in range(TRIES if span is not None else 0):
            if len(socks) == n:
                break
            sock = _bound(host, random.choice(span))
            if sock is not None:
                socks.append(sock)
        while len(socks) < n:  # no room below the ephemeral range (or none free there): the kernel's pick
            sock = socket.socket()
            sock.bind((host, 0))
            socks.append(sock)
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def free_port(host: str = "127.0.0.1") -> int:
    return free_ports(host, 1)[0]


def is_free(port: int, host: str = "127.0.0.1") -> bool:
    sock = _bound(host, port)
    if sock is None:
        return False
    sock.close()
    return True


def free_base_port(offsets: tuple[int, ...]) -> int:
    """A base port with base + each offset free (a topology's ports laid out from one base)."""
    span = _span(max(offsets)) or range(LOWEST, LOWEST + 20000)
    for _ in range(TRIES):
        base = random.choice(span)
        if all(is_free(base + d) for d in offsets):
            return base
    raise RuntimeError("no free base port")
