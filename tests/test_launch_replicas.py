"""launch's aggregated serving (replicas behind the proxy) and MPS shares: command lines, shares in the dry run,
refusals in one line with exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hybridserve.cli.app import app
from hybridserve.core.common.errors import InputError
from hybridserve.core.host import mps_daemon
from hybridserve.core.launch import mps
from hybridserve.core.launch.launch_plan import Role, make_launch_plan
from hybridserve.core.launch.machine import machine_plan
from hybridserve.core.launch.topology_file import load_topology

runner = CliRunner()
PD_ONLY = {"--kv-transfer-config"}  # the one flag that differs by the P/D split itself


def _dry_run(*args: str) -> dict:
    result = runner.invoke(app, ["launch", "--dry-run", "--json", *args])
    assert result.exit_code == 0, result.output
    return {c["name"]: c for c in json.loads(result.stdout)["commands"]}


def _flags(argv: list[str]) -> dict[str, str | None]:
    """--flag -> its value (None for a switch), host and port left out: they differ per engine by design."""
    out, i = {}, 3
    while i < len(argv):
        value = argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else None
        out[argv[i]] = value
        i += 1 if value is None else 2
    return {k: v for k, v in out.items() if k not in ("--host", "--port")}


def test_two_replicas_get_cores_0_and_1_and_pds_engine_flags():
    replicas = _dry_run("--replicas", "2", "--base-port", "41000")
    pd = _dry_run("--role", "all", "--base-port", "42000")
    assert list(replicas) == ["replica-0", "replica-1", "proxy"]
    assert [replicas[f"replica-{i}"]["env"]["VLLM_CPU_OMP_THREADS_BIND"] for i in (0, 1)] == ["0", "1"]
    assert [replicas[f"replica-{i}"]["share"] for i in (0, 1)] == ["cores 0", "cores 1"]
    assert (pd["prefill-0"]["share"], pd["decode-0"]["share"]) == ("cores 0", "cores 1")  # equal resources on CPU
    for name in ("replica-0", "replica-1"):
        flags = _flags(replicas[name]["argv"])
        for engine in ("prefill-0", "decode-0"):
            expected = {k: v for k, v in _flags(pd[engine]["argv"]).items() if k not in PD_ONLY}
            assert flags == expected, (name, engine)
    proxy = replicas["proxy"]["argv"]
    assert [proxy[i + 1] for i, a in enumerate(proxy) if a == "--replica"] == ["http://127.0.0.1:41100",
                                                                                "http://127.0.0.1:41200"]
    assert "--prefill" not in proxy and "--decode" not in proxy


def test_one_replica_of_a_topology_and_its_proxy(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("replicas:\n  - {port: 8110, devices: [0]}\n  - {port: 8120, devices: [1]}\n"
                    "proxy: {port: 8010, policy: least_outstanding}\n")
    topology = load_topology(path)
    plan = make_launch_plan(topology, Role.REPLICA, index=1)
    assert [c.name for c in plan.commands] == ["replica-1"] and plan.commands[0].side_channel_port is None
    proxy = make_launch_plan(topology, Role.PROXY).command("proxy").argv
    assert "least_outstanding" in proxy and proxy.count("--replica") == 2
    with pytest.raises(InputError, match="--index 2: the topology has 2 replica instance"):
        make_launch_plan(topology, Role.REPLICA, index=2)


def _mps_topology(tmp_path: Path, sm: str = "50", device: str = "cuda", kind: str = "replicas") -> Path:
    path = tmp_path / "mps.yaml"
    ports = "{port: %d, devices: [0], gpu_memory_utilization: 0.4, sm_percent: %s}"
    body = (f"replicas:\n  - {ports % (18100, sm)}\n  - {ports % (18200, sm)}\n" if kind == "replicas" else
            f"prefill:\n  - {ports[:-1] % (18100, sm)}, side_channel_port: 18150}}\n"
            f"decode:\n  - {ports[:-1] % (18200, sm)}, side_channel_port: 18250}}\n")
    path.write_text(f"device: {device}\n{body}proxy: {{port: 18000}}\n")
    return path


@pytest.mark.parametrize("kind", ["replicas", "pd"])
def test_a_cpu_dry_run_shows_each_engines_sm_and_memory_share(tmp_path, kind):
    commands = _dry_run("--topology", str(_mps_topology(tmp_path, kind=kind)))
    engines = [c for name, c in commands.items() if name != "proxy"]
    assert len(engines) == 2
    for c in engines:
        assert c["env"][mps.PERCENT_ENV] == "50" and c["sm_percent"] == 50 and c["gpu_memory_utilization"] == 0.4
        assert c["share"] == ("GPU 0: 50 % of the SMs (MPS: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE), 0.4 of its memory "
                              "(--gpu-memory-utilization)")
    text = runner.invoke(app, ["launch", "--dry-run", "--topology", str(_mps_topology(tmp_path, kind=kind))]).stdout
    assert text.count("# share: GPU 0: 50 % of the SMs") == 2


@pytest.mark.parametrize("text,expected", [
    ("replicas:\n  - {port: 1}\nprefill:\n  - {port: 2, side_channel_port: 3}\ndecode:\n  - {port: 4, "
     "side_channel_port: 5}\n", "both replicas and prefill/decode instances"),
    ("prefill:\n  - {port: 2, side_channel_port: 3}\n", "decode: accepted: a non-empty list"),
    ("replicas: []\n", "replicas: accepted: a non-empty list of instances (host, port)"),
], ids=["both", "prefill-alone", "no-replica"])
def test_topology_shape_refusals(tmp_path, text, expected):
    path = tmp_path / "t.yaml"
    path.write_text(text)
    result = runner.invoke(app, ["launch", "--topology", str(path), "--dry-run"])
    assert result.exit_code == 2 and expected in result.output
    assert len(result.output.strip().splitlines()) == 1


@pytest.mark.parametrize("sm,device,expected", [
    ("0", "cuda", "replica-0: sm_percent 0; accepted: 1-100"),
    ("101", "cuda", "replica-0: sm_percent 101; accepted: 1-100"),
    ("50", "cpu", "replica-0: sm_percent 50 on device cpu; accepted: sm_percent with device cuda only"),
], ids=["zero", "over-100", "cpu"])
def test_share_refusals(tmp_path, sm, device, expected):
    result = runner.invoke(app, ["launch", "--topology", str(_mps_topology(tmp_path, sm, device)), "--dry-run"])
    assert result.exit_code == 2 and expected in result.output


def test_a_real_start_refuses_a_share_without_the_mps_daemon(tmp_path, monkeypatch):
    topology = load_topology(_mps_topology(tmp_path))
    monkeypatch.setattr("hybridserve.core.launch.machine.find_daemon", lambda: None)
    with pytest.raises(InputError) as err:
        machine_plan(topology, Role.REPLICA, num_gpus=1, vllm="0.26")
    assert str(err.value) == ("replica-0: sm_percent 50 on GPU 0, but no MPS control daemon runs here (nothing "
                              "listening in /tmp/nvidia-mps); accepted: start it first (nvidia-cuda-mps-control -d), "
                              "or no sm_percent")
    monkeypatch.setattr("hybridserve.core.launch.machine.find_daemon",
                        lambda: mps_daemon.MpsDaemon(pipe_dir=Path("/tmp/nvidia-mps"), gpus=(1,)))
    with pytest.raises(InputError, match="but the MPS daemon serves GPUs 1 only"):
        machine_plan(topology, Role.REPLICA, num_gpus=1, vllm="0.26")
    monkeypatch.setattr("hybridserve.core.launch.machine.find_daemon",
                        lambda: mps_daemon.MpsDaemon(pipe_dir=Path("/tmp/nvidia-mps")))
    assert len(machine_plan(topology, Role.REPLICA, num_gpus=1, vllm="0.26").commands) == 2


def test_the_cli_refuses_it_in_one_line_exit_2(tmp_path, monkeypatch):
    monkeypatch.setattr("hybridserve.core.launch.machine.find_daemon", lambda: None)
    monkeypatch.setattr("hybridserve.core.launch.request.count_gpus", lambda: 1)
    monkeypatch.setattr("hybridserve.core.launch.machine.count_gpus", lambda: 1)
    result = runner.invoke(app, ["launch", "--topology", str(_mps_topology(tmp_path)), "--role", "replica",
                                 "--vllm-version", "0.26", "--run-dir", str(tmp_path / "runs")])
    assert result.exit_code == 2, result.output
    assert "no MPS control daemon runs here" in result.output and len(result.output.strip().splitlines()) == 1


def _proc(tmp_path: Path, name: str, environ: dict[str, str]) -> Path:
    proc = tmp_path / "proc"
    (proc / "4242").mkdir(parents=True)
    (proc / "4242" / "cmdline").write_bytes(f"/usr/bin/{name}\0-d\0".encode())
    (proc / "4242" / "environ").write_bytes(b"".join(f"{k}={v}\0".encode() for k, v in environ.items()))
    (proc / "self").mkdir()
    return proc


def test_the_daemon_is_found_by_its_process_and_control_pipe(tmp_path):
    pipe = tmp_path / "pipes"
    pipe.mkdir()
    proc = _proc(tmp_path, mps_daemon.CONTROL, {"CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_VISIBLE_DEVICES": "0,2"})
    assert mps_daemon.find_daemon(proc=proc) is None  # the process, but no control pipe
    (pipe / "control").write_text("")
    assert mps_daemon.find_daemon(proc=proc) == mps_daemon.MpsDaemon(pipe_dir=pipe, gpus=(0, 2))
    other = _proc(tmp_path / "b", "nvidia-smi", {"CUDA_MPS_PIPE_DIRECTORY": str(pipe)})
    assert mps_daemon.find_daemon(proc=other) is None
