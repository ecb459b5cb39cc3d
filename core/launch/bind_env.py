"""Where a vLLM server's side listeners bind: only on the address its topology names.

Besides its HTTP port (`--host`) and NIXL side channel (`VLLM_NIXL_SIDE_CHANNEL_HOST`), a vLLM server opens
listeners that pick an address of their own: UCX's TCP transport listens on every network device (NIXL's UCX
backend, in the worker process), gloo's TCP device on the address the host name resolves to (vLLM's CPU process
group, even at TP 1), and vLLM's `get_ip()` returns the first non-loopback address. On one host they would
expose the KV transfer ports to the network. The variables below pin all three to the instance's address:

- `UCX_NET_DEVICES`: the network device that holds the address (`lo` for 127.x), so UCX listens there only;
- `GLOO_SOCKET_IFNAME`: the same device for gloo;
- `VLLM_HOST_IP`: the address itself for vLLM's own `get_ip()`.

An address that is not on this machine (a dry run for another host) gets `VLLM_HOST_IP` only: the device is
named where that host's launch runs.
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct

_SIOCGIFADDR = 0x8915  # <linux/sockios.h>: an interface's IPv4 address


def listener_env(host: str) -> dict[str, str]:
    device = network_device(host)
    env = {"VLLM_HOST_IP": host}
    if device is not None:
        env.update(UCX_NET_DEVICES=device, GLOO_SOCKET_IFNAME=device)
    return env


def network_device(host: str) -> str | None:
    """The name of this machine's network device that holds `host` ('lo' for loopback); None: not here."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:  # a host name: resolved where the role runs, not guessed here
        return None
    if address.is_loopback:
        return "lo"
    if address.version != 4:
        return None
    for _, name in _interfaces():
        if _ipv4_of(name) == str(address):
            return name
    return None


def _interfaces() -> list[tuple[int, str]]:
    try:
        return socket.if_nameindex()
    except OSError:
        return []


def _ipv4_of(name: str) -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            packed = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError:  # no IPv4 address on it
            return None
    return socket.inet_ntoa(packed[20:24])
