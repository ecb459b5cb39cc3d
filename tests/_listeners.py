"""The TCP/UDP sockets that processes listen on, read from /proc (no ss/psutil needed): inode -> pid via
/proc/PID/fd, inode -> address via /proc/net/{tcp,tcp6,udp,udp6} (state 0A = LISTEN; UDP: bound, unconnected)."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path


def session_pids(sid: int) -> list[int]:
    """Every live process of session `sid` (a role's process group leader started its own session)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] not in ("Z", "X"):  # fields: state ppid pgrp session ...
            pids.append(int(entry.name))
    return pids


def _socket_inodes(pid: int) -> set[int]:
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    except OSError:
        pass
    return inodes


def _address(hex_addr: str) -> str:
    host, port = hex_addr.split(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        ip = ipaddress.IPv4Address(raw[::-1])
    else:  # four little-endian 32-bit words
        ip = ipaddress.IPv6Address(b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
    return f"{ip}:{int(port, 16)}"


def listening(pids: list[int]) -> list[tuple[int, str, str]]:
    """(pid, protocol, address:port) of every listening TCP socket and bound UDP socket of these processes."""
    owner = {inode: pid for pid in pids for inode in _socket_inodes(pid)}
    found = []
    for proto in ("tcp", "tcp6", "udp", "udp6"):
        try:
            lines = Path(f"/proc/net/{proto}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            local, remote, state, inode = cols[1], cols[2], cols[3], int(cols[9])
            is_listening = state == "0A" if proto.startswith("tcp") else remote.split(":")[1] == "0000"
            if inode in owner and is_listening:
                found.append((owner[inode], proto, _address(local)))
    return sorted(found)


def is_loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0]
    ip = ipaddress.ip_address(host)
    return ip.is_loopback or (isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None
                              and ip.ipv4_mapped.is_loopback)
