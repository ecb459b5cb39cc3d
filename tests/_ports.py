"""Free TCP ports for the tests' servers, picked by binding port 0 (the kernel's choice) and letting go."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def free_ports(host: str, n: int) -> list[int]:
    """n distinct free ports of `host`: every socket stays bound until all are picked (one at a time, the kernel
    may hand the same port out twice, and launch refuses a topology that names a port twice)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for sock in socks:
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_base_port(offsets: tuple[int, ...]) -> int:
    """A base port in 20000-39999 with base + each offset free (a topology's ports laid out from one base)."""
    for _ in range(50):
        base = free_port() % 20000 + 20000
        if all(is_free(base + d) for d in offsets):
            return base
    raise RuntimeError("no free base port")
