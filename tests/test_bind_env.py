"""Where a server's side listeners (UCX, gloo, vLLM's get_ip) bind: the instance's own address, never all of them."""

from __future__ import annotations

import socket
from dataclasses import replace

import pytest

from hybridserve.core.launch.engine_command import engine_env
from hybridserve.core.launch.topology import local_topology


def _env(host: str) -> dict[str, str]:
    topology = local_topology()
    return dict(engine_env(topology, replace(topology.prefill[0], host=host)))


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2"])
def test_one_host_pins_ucx_and_gloo_to_loopback(host):
    env = _env(host)
    assert (env["UCX_NET_DEVICES"], env["GLOO_SOCKET_IFNAME"], env["VLLM_HOST_IP"]) == ("lo", "lo", host)
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == host


def _this_hosts_address() -> str | None:
    """A non-loopback IPv4 address of this machine (the source address of a route; nothing is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("192.0.2.1", 9))
        except OSError:
            return None
        address = sock.getsockname()[0]
    return None if address.startswith("127.") or address == "0.0.0.0" else address


def test_a_topology_address_of_this_host_pins_its_own_device():
    address = _this_hosts_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    env = _env(address)
    device = env["UCX_NET_DEVICES"]
    assert device != "lo" and env["GLOO_SOCKET_IFNAME"] == device and env["VLLM_HOST_IP"] == address
    assert device in {name for _, name in socket.if_nameindex()}


def test_an_address_of_another_host_sets_only_the_address():
    env = _env("198.51.100.7")  # TEST-NET-2: on no machine here; that host's own launch names its device
    assert env["VLLM_HOST_IP"] == "198.51.100.7"
    assert "UCX_NET_DEVICES" not in env and "GLOO_SOCKET_IFNAME" not in env


def test_an_instance_env_still_wins():
    topology = local_topology()
    inst = replace(topology.prefill[0], env=(("UCX_NET_DEVICES", "mlx5_0:1"),))
    assert dict(engine_env(topology, inst))["UCX_NET_DEVICES"] == "mlx5_0:1"
