"""The proxy in front of replicas (aggregated serving): each request whole on one replica, by the policy, around a
replica that fails before any byte reached the client; /health and /v1/models say what it fronts."""

from __future__ import annotations

import httpx
import pytest
from fastapi.testclient import TestClient

from hybridserve.core.launch.topology import RoutingPolicy
from hybridserve.core.proxy.__main__ import parse_args
from hybridserve.core.proxy.app import create_app
from hybridserve.core.proxy.config import ProxyConfig
from test_proxy import Servers, _Stream

R1, R2, R3 = "http://r1:1", "http://r2:1", "http://r3:1"


def _client(servers: Servers, replicas=(R1, R2), policy=RoutingPolicy.ROUND_ROBIN) -> TestClient:
    config = ProxyConfig(replica_urls=replicas, policy=policy, timeout_s=5.0)
    return TestClient(create_app(config, transport=httpx.MockTransport(servers)))


def test_each_request_goes_whole_to_one_replica_in_turn():
    servers = Servers()
    with _client(servers) as client:
        answers = [client.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 16}) for _ in range(4)]
    assert [a.json()["served_by"] for a in answers] == ["r1", "r2", "r1", "r2"]
    # one hop a request, the client's body as sent: no max_tokens 1, no kv_transfer_params
    assert [(host, body) for host, body, _ in servers.seen] == [(h, {"prompt": [1, 2, 3], "max_tokens": 16})
                                                                for h in ("r1", "r2", "r1", "r2")]


def test_least_outstanding_sends_to_the_idle_replica():
    from hybridserve.core.proxy.routing import EndpointPool

    pool = EndpointPool("replica", (R1, R2), RoutingPolicy.LEAST_OUTSTANDING)
    with pool.held(R1):
        assert pool.choose() == R2
    assert pool.choose() == R1


@pytest.mark.parametrize("failure", [500, httpx.ConnectError("refused")], ids=["http-500", "refused"])
def test_a_failing_replica_is_routed_around(failure):
    servers = Servers(fail={"r1": failure})
    with _client(servers) as client:
        answer = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 4})
        metrics = client.get("/metrics").text
    assert answer.status_code == 200 and answer.json()["served_by"] == "r2"
    assert [host for host, _, _ in servers.seen] == ["r1", "r2"]
    assert 'hybridserve_proxy_requests_total{outcome="ok"} 1' in metrics


def test_every_replica_failing_names_the_last_one():
    servers = Servers(fail={"r1": 500, "r2": 503})
    with _client(servers) as client:
        answer = client.post("/v1/completions", json={"prompt": "hi"})
        metrics = client.get("/metrics").text
    error = answer.json()["error"]
    assert answer.status_code == 502 and error["role"] == "replica" and "http://r2:1 failed: HTTP 503" in error["message"]
    assert "before it: replica server http://r1:1 failed" in error["message"]
    assert 'outcome="replica_error"} 1' in metrics


def test_a_client_error_is_passed_on_and_not_retried():
    servers = Servers(fail={"r1": 400})
    with _client(servers) as client:
        answer = client.post("/v1/completions", json={"prompt": "hi"})
    assert answer.status_code == 400 and [host for host, _, _ in servers.seen] == ["r1"]


def test_a_stream_is_relayed_from_its_replica():
    chunks = [b'data: {"choices":[{"text":"a"}]}\n\n', b"data: [DONE]\n\n"]
    servers = Servers(stream_chunks=chunks)
    with _client(servers, replicas=(R3,)) as client:
        with client.stream("POST", "/v1/completions", json={"prompt": "hi", "stream": True}) as answer:
            body = b"".join(answer.iter_bytes())
        metrics = client.get("/metrics").text
    assert answer.status_code == 200 and body == b"".join(chunks)
    assert 'hybridserve_proxy_outstanding{role="replica",url="http://r3:1"} 0' in metrics
    assert _Stream  # the scripted stream type the replica answered with


def test_health_and_models_name_the_replicas():
    with _client(Servers()) as client:
        health = client.get("/health").json()
        models = client.get("/v1/models").json()
    assert health == {"status": "ok", "replica": [R1, R2], "down": {"replica": {}}}
    assert models["data"][0]["id"] == "tiny"


@pytest.mark.parametrize("argv", [[], ["--replica", R1, "--prefill", R2], ["--prefill", R1]],
                         ids=["nothing", "replicas-and-prefill", "prefill-alone"])
def test_the_command_line_takes_pd_or_replicas(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    assert "accepted: --prefill and --decode URLs (P/D), or --replica URLs (aggregated)" in capsys.readouterr().err


def test_the_command_line_reads_replicas():
    config, _, _ = parse_args(["--replica", R1, "--replica", R2, "--policy", "least_outstanding"])
    assert config.replica_urls == (R1, R2) and config.prefill_urls == () and config.policy.value == "least_outstanding"


def test_bench_reads_the_settings_of_the_replicas_behind_the_proxy(tmp_path):
    """bench's like-for-like check finds a replicas deployment's engines in the proxy's /health, as P/D's."""
    from hybridserve.core.bench.likeness.readings import url_settings

    info = ('vllm:cache_config_info{block_size="256",cache_dtype="auto",mamba_cache_dtype="bfloat16",'
            'mamba_ssm_cache_dtype="float32",engine="0"} 1.0\n')

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.host == "proxy":
            return httpx.Response(200, json={"status": "ok", "replica": [R1, R2], "down": {"replica": {}}})
        return httpx.Response(200, text=info)

    with httpx.Client(transport=httpx.MockTransport(answer)) as client:
        settings = url_settings(client, "deployment", "http://proxy:1", max_model_len=2048, num_gpus=None,
                                run_root=tmp_path)
    assert [e.name for e in settings.engines] == ["replica-0", "replica-1"]
    assert all(e.readings for e in settings.engines)
