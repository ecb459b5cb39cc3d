"""Network namespaces as hosts: one namespace per host, each with an `eth0` on one bridge, for multi-host tests.

    with hosts({"prefill": "10.77.0.1", ...}) as net:   # ip netns add + veth pairs + a bridge
        net.popen("prefill", argv)                       # the command runs as if on that host
        net.listeners("prefill")                          # `ss -ltunpH` inside it

The bridge lives in a namespace of its own, so nothing is added to this machine's own network: deleting the
namespaces removes every interface. Needs root (CAP_SYS_ADMIN + CAP_NET_ADMIN); `unavailable()` says why not.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field

PREFIX_LEN = 24
DEVICE = "eth0"  # each host's one interface, as on a real host


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip() or result.returncode}")


def unavailable() -> str | None:
    """None when `ip netns add` works here; else its error, word for word."""
    name = f"hs-probe-{os.getpid()}"
    try:
        _ip("netns", "add", name)
    except (OSError, RuntimeError) as exc:
        return str(exc)
    _ip("netns", "del", name)
    return None


@dataclass
class Hosts:
    tag: str  # unique per run: namespaces are hs-<tag>-<host>
    addresses: dict[str, str]  # host name -> IPv4 address on the shared subnet
    namespaces: list[str] = field(default_factory=list)  # created, in order (the bridge's first)

    def netns(self, host: str) -> str:
        return f"hs-{self.tag}-{host}"

    def exec_argv(self, host: str, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.netns(host), *argv]

    def popen(self, host: str, argv: list[str], **kwargs) -> subprocess.Popen:  # noqa: ANN003
        """`ip netns exec` execs the command: the Popen's pid is the command's own."""
        return subprocess.Popen(self.exec_argv(host, argv), **kwargs)

    def run(self, host: str, argv: list[str], timeout_s: float = 60, stdin: str | None = None
            ) -> subprocess.CompletedProcess:
        """`stdin`: text for the command's standard input (a secret goes there, never into argv, where ps shows it)."""
        return subprocess.run(self.exec_argv(host, argv), capture_output=True, text=True, timeout=timeout_s,
                              input=stdin)

    def listeners(self, host: str) -> list[tuple[str, str, str]]:
        """(protocol, local address:port, process) of every listening TCP and bound UDP socket in the host's
        namespace, from `ss -ltunpH` run inside it (the namespace holds only what the test started there)."""
        out = self.run(host, ["ss", "-ltunpH"]).stdout
        rows = []
        for line in out.splitlines():
            cols = line.split()  # Netid State Recv-Q Send-Q Local Peer [Process]
            rows.append((cols[0], cols[4], " ".join(cols[6:])))
        return rows


def _add_namespace(net: Hosts, name: str) -> None:
    _ip("netns", "add", name)
    net.namespaces.append(name)
    _ip("-n", name, "link", "set", "lo", "up")


def _build(net: Hosts) -> None:
    bridge_ns = net.netns("switch")
    _add_namespace(net, bridge_ns)
    _ip("-n", bridge_ns, "link", "add", "br0", "type", "bridge")
    _ip("-n", bridge_ns, "link", "set", "br0", "up")
    for i, (host, address) in enumerate(net.addresses.items()):
        ns = net.netns(host)
        _add_namespace(net, ns)
        port, end = f"port{i}", f"hs{net.tag[-6:]}{i}"  # interface names: at most 15 characters
        _ip("-n", bridge_ns, "link", "add", port, "type", "veth", "peer", "name", end, "netns", ns)
        _ip("-n", bridge_ns, "link", "set", port, "master", "br0", "up")
        _ip("-n", ns, "link", "set", end, "name", DEVICE)
        _ip("-n", ns, "addr", "add", f"{address}/{PREFIX_LEN}", "dev", DEVICE)
        _ip("-n", ns, "link", "set", DEVICE, "up")


def remove(net: Hosts) -> None:
    """Delete the namespaces (their veth ends and the bridge go with them); the hosts' own first."""
    for name in reversed(net.namespaces):
        with contextlib.suppress(OSError, RuntimeError):
            _ip("netns", "del", name)
    net.namespaces.clear()


def remove_stale() -> None:
    """Delete the namespaces an earlier run left when it was killed (its pid, in their names, is gone)."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30).stdout
    for name in (line.split()[0] for line in listed.splitlines() if line.startswith("hs-")):
        pid = name.split("-")[1]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            with contextlib.suppress(OSError, RuntimeError):
                _ip("netns", "del", name)


@contextlib.contextmanager
def hosts(addresses: dict[str, str]) -> Iterator[Hosts]:
    remove_stale()
    net = Hosts(tag=f"{os.getpid()}", addresses=dict(addresses))
    try:
        _build(net)
        yield net
    finally:
        remove(net)
