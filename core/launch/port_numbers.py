"""Every port a topology names must be a TCP port number (1-65535), checked before any command line is built.

Launch without `--topology` derives the ports from `--base-port` (topology.local_topology: proxy B, prefill B+100
and its NIXL side channel B+150, decode B+200 and B+250), so B must lie in 1-65285 for all five to be valid.
"""

from __future__ import annotations

from hybridserve.core.common.errors import InputError
from hybridserve.core.launch.topology import Topology

MAX_PORT = 65535


def check_port_numbers(topology: Topology) -> None:
    """Raise InputError naming the first instance whose port is out of range."""
    named = [("proxy", "port", topology.proxy.port)]
    if topology.proxy.metrics_port is not None:
        named.append(("proxy", "metrics_port", topology.proxy.metrics_port))
    for kind, instances in (("prefill", topology.prefill), ("decode", topology.decode)):
        for i, inst in enumerate(instances):
            named += [(f"{kind}-{i}", "port", inst.port), (f"{kind}-{i}", "side_channel_port", inst.side_channel_port)]
    named += [(f"replica-{i}", "port", inst.port) for i, inst in enumerate(topology.replicas)]  # no side channel
    for name, what, port in named:
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= MAX_PORT:
            raise InputError(f"{name}: {what} {port} is not a TCP port; accepted: 1-{MAX_PORT} (without --topology "
                             f"the roles get --base-port +0, +100, +150, +200 and +250, so --base-port 1-"
                             f"{MAX_PORT - 250})")
