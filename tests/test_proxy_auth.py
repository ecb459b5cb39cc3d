"""The doors of a deployment (core/proxy/auth.py): the proxy asks clients for the front key, the engines ask for the
engine key that only the proxy sends, and what the proxy owns in a request (kv_transfer_params, the Authorization
header) never comes from the client. Fake engines by httpx.MockTransport, as in tests/test_proxy.py; the engines'
guard inside vLLM's own app (its routes, no engine started)."""

from __future__ import annotations

import json
import logging

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from hybridserve.core.launch.topology import FirstTokenSource
from hybridserve.core.proxy import hops
from hybridserve.core.proxy.__main__ import parse_args
from hybridserve.core.proxy.app import create_app
from hybridserve.core.proxy.auth import REFUSAL, EngineGuard
from hybridserve.core.proxy.config import ProxyConfig
from hybridserve.core.proxy.first_token import FULL_PREFILL_KEY

FRONT, ENGINE = "front-key-0123456789abcdef", "engine-key-0123456789abcdef"
PREFILL_KV = {"do_remote_prefill": True, "remote_engine_id": "p-engine", "remote_host": "10.77.0.1",
              "remote_port": 5600, "remote_block_ids": [[1], [2], [3], [4]], "remote_request_id": "r"}
# What a stranger would have decode READ from: an agent of their choosing (issue 31)
HOSTILE_KV = {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "evil", "remote_host":
              "6.6.6.6", "remote_port": 6666, "remote_block_ids": [[0], [0], [0], [0]], FULL_PREFILL_KEY: False}


class Engines:
    """Scripted prefill (host p) and decode (host d); records (host, path, Authorization header, body)."""

    def __init__(self, *, token_text: str = " A") -> None:
        self.seen: list[tuple[str, str, str | None, dict]] = []
        self.token_text = token_text

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else {}
        host, path = request.url.host, request.url.path
        self.seen.append((host, path, request.headers.get("authorization"), body))
        if path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "tiny", "max_model_len": 100}]})
        if path == "/detokenize":  # token 1 (id 7) alone is half a character
            return httpx.Response(200, json={"prompt": "\ufffd" if body.get("tokens") == [7] else "\u00e9ok"})
        if host == "p":
            choice = {"index": 0, "text": self.token_text, "logprobs": None, "finish_reason": "length",
                      "prompt_token_ids": [11, 12], "token_ids": [7], "message": {"content": " A"}}
            kv = PREFILL_KV if "kv_transfer_params" in body else None
            return httpx.Response(200, json={"id": "c", "created": 1, "model": "tiny", "choices": [choice],
                                             "usage": {"prompt_tokens": 2, "completion_tokens": 1},
                                             "kv_transfer_params": kv})
        if body.get("stream"):
            return httpx.Response(200, content=b'data: {"choices":[{"text":"ok","token_ids":[8]}]}\n\ndata: [DONE]\n\n')
        return httpx.Response(200, json={"choices": [{"text": "ok", "token_ids": [8], "finish_reason": "length"}],
                                         "usage": {"prompt_tokens": 3, "completion_tokens": 1}})

    def hops(self) -> list[tuple[str, str, str | None, dict]]:
        return [s for s in self.seen if s[1] != "/v1/models"]


def _client(engines: Engines, *, api_key: str | None = FRONT, engine_key: str | None = ENGINE,
            first_token: FirstTokenSource = FirstTokenSource.PREFILL) -> TestClient:
    config = ProxyConfig(prefill_urls=("http://p:1",), decode_urls=("http://d:1",), timeout_s=5.0,
                         first_token=first_token, api_key=api_key, engine_key=engine_key)
    return TestClient(create_app(config, transport=httpx.MockTransport(engines)))


COMPLETION = {"prompt": "hi", "max_tokens": 4}


@pytest.mark.parametrize("headers", [
    {}, {"Authorization": "Bearer wrong-key-0123456789abcdef"}, {"Authorization": f"Basic {FRONT}"},
    {"Authorization": f"Bearer {FRONT[:-1]}"}, {"Authorization": f"Bearer {ENGINE}"}, {"Authorization": "Bearer"},
], ids=["none", "wrong", "not-bearer", "prefix", "engine-key", "empty"])
@pytest.mark.parametrize("method,path", [("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
                                         ("GET", "/v1/models"), ("GET", "/docs"), ("OPTIONS", "/v1/completions")],
                         ids=["completions", "chat", "models", "docs", "options"])
def test_without_the_front_key_the_answer_is_401_and_no_engine_hears_of_it(headers, method, path):
    engines = Engines()
    with _client(engines) as client:
        reply = client.request(method, path, headers=headers, json=COMPLETION)
        metrics = client.get("/metrics").text
    assert reply.status_code == 401 and reply.json() == REFUSAL
    assert reply.headers["www-authenticate"] == "Bearer"
    assert FRONT not in reply.text and ENGINE not in reply.text
    assert engines.seen == []
    assert 'hybridserve_proxy_requests_total{outcome="unauthorized"} 1' in metrics


def test_health_and_metrics_stay_open():
    with _client(Engines()) as client:
        assert client.get("/health").status_code == 200 and client.get("/metrics").status_code == 200


@pytest.mark.parametrize("source", list(FirstTokenSource))
@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {**COMPLETION}), ("/v1/completions", {**COMPLETION, "stream": True}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
], ids=["completion", "stream", "chat"])
def test_with_the_front_key_every_hop_carries_the_engine_key_only(source, path, body):
    engines = Engines()
    with _client(engines, first_token=source) as client:
        reply = client.post(path, headers={"Authorization": f"Bearer {FRONT}"}, json=body)
        models = client.get("/v1/models", headers={"authorization": f"bearer {FRONT}"})  # any case of the scheme
    assert reply.status_code == 200 and models.status_code == 200
    assert "data: [DONE]" in reply.text if body.get("stream") else reply.json()["choices"]
    assert [s[0] for s in engines.hops()] == ["p", "d"]
    assert {s[2] for s in engines.seen} == {f"Bearer {ENGINE}"}  # never the client's key


def test_the_detokenize_call_of_the_first_token_path_carries_the_engine_key():
    engines = Engines(token_text="")  # token 1 is part of a character: the text comes from /detokenize
    with _client(engines) as client:
        reply = client.post("/v1/completions", headers={"Authorization": f"Bearer {FRONT}"}, json=COMPLETION)
    assert reply.status_code == 200 and reply.json()["choices"][0]["text"] == "\u00e9ok"
    calls = [s[2] for s in engines.seen if s[1] == "/detokenize"]  # token 1 alone, then the output's ids
    assert len(calls) == 2 and set(calls) == {f"Bearer {ENGINE}"}


def test_without_keys_nothing_asks_and_the_clients_header_is_not_passed_on():
    engines = Engines()
    with _client(engines, api_key=None, engine_key=None) as client:
        reply = client.post("/v1/completions", headers={"Authorization": "Bearer client-own"}, json=COMPLETION)
    assert reply.status_code == 200
    assert {s[2] for s in engines.seen} == {None}


@pytest.mark.parametrize("source", list(FirstTokenSource))
@pytest.mark.parametrize("body", [
    {"prompt": "hi", "max_tokens": 4}, {"prompt": "hi", "max_tokens": 4, "stream": True},
    {"prompt": "hi", "max_tokens": 1}, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
], ids=["completion", "stream", "one-token", "chat"])
def test_client_kv_transfer_params_never_reach_an_engine(source, body):
    """The client's kv_transfer_params (a remote host and port of its choosing, vLLM's guard key) are replaced:
    prefill gets the proxy's, decode gets exactly what prefill answered."""
    engines = Engines()
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    with _client(engines, first_token=source) as client:
        reply = client.post(path, headers={"Authorization": f"Bearer {FRONT}"},
                            json={**body, "kv_transfer_params": HOSTILE_KV})
    assert reply.status_code == 200
    sent = [(host, s_body.get("kv_transfer_params")) for host, _, _, s_body in engines.hops()]
    is_first_token_path = source is FirstTokenSource.PREFILL and path == "/v1/completions"
    expected_prefill = dict(hops.PREFILL_KV_PARAMS, **({FULL_PREFILL_KEY: True} if is_first_token_path else {}))
    if is_first_token_path and body["max_tokens"] == 1:  # prefill's token is the whole answer: no transfer at all
        assert sent == [("p", None)]
        return
    assert sent == [("p", expected_prefill), ("d", PREFILL_KV)]
    assert "6.6.6.6" not in json.dumps(engines.seen)


def _key_file(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_the_proxy_reads_its_keys_from_files_and_shows_them_nowhere(tmp_path):
    argv = ["--prefill", "http://p:1", "--decode", "http://d:1",
            "--api-key-file", _key_file(tmp_path, "front", FRONT + "\n"),
            "--engine-key-file", _key_file(tmp_path, "engine", ENGINE + "\n")]
    config, _, _ = parse_args(argv)
    assert (config.api_key, config.engine_key) == (FRONT, ENGINE)
    assert FRONT not in repr(config) and ENGINE not in repr(config)


def test_a_bad_key_file_stops_the_proxy_with_one_line_naming_the_file(tmp_path, capsys):
    bad = _key_file(tmp_path, "front", "too-short\n")
    with pytest.raises(SystemExit) as info:
        parse_args(["--prefill", "http://p:1", "--decode", "http://d:1", "--api-key-file", bad])
    err = capsys.readouterr().err
    assert info.value.code == 2 and f"--api-key-file {bad}: the key is shorter than 16" in err
    assert "too-short" not in err.replace(bad, "")


def _engine_app(monkeypatch, key: str | None) -> TestClient:
    if key is None:
        monkeypatch.delenv("VLLM_API_KEY", raising=False)
    else:
        monkeypatch.setenv("VLLM_API_KEY", key)
    inner = FastAPI()
    for path in ("/health", "/metrics", "/invocations", "/detokenize", "/v1/completions"):
        inner.add_api_route(path, lambda: {"ok": True}, methods=["GET", "POST"])
    return TestClient(EngineGuard(inner))


@pytest.mark.parametrize("path", ["/invocations", "/detokenize", "/v1/completions"])
def test_the_engine_guard_asks_for_the_engine_key(monkeypatch, path):
    client = _engine_app(monkeypatch, ENGINE)
    assert client.post(path).status_code == 401
    assert client.post(path, headers={"Authorization": f"Bearer {FRONT}"}).status_code == 401
    assert client.post(path, headers={"Authorization": f"Bearer {ENGINE}"}).status_code == 200
    assert client.get("/health").status_code == 200 and client.get("/metrics").status_code == 200


def test_the_engine_guard_without_its_variable_refuses_all_but_the_open_paths(monkeypatch):
    client = _engine_app(monkeypatch, None)
    assert client.post("/invocations", headers={"Authorization": "Bearer "}).status_code == 401
    assert client.get("/health").status_code == 200


def test_inside_vllms_app_the_guard_closes_what_vllms_own_key_check_leaves_open(monkeypatch):
    """vLLM's app (its routes and middleware, no engine): with VLLM_API_KEY alone /invocations, which serves
    completions, and /detokenize answer without a key; with the guard launch adds (--middleware) they are 401."""
    from hybridserve.core.vllm_plugin import torchvision_shim

    torchvision_shim.install_lazy()  # vllm.config imports torchvision (see the shim)
    pytest.importorskip("vllm", reason="needs the cpu or cuda extra")
    from vllm.entrypoints.launchers.app import build_app
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from hybridserve.core.launch.engine_command import ENGINE_GUARD

    monkeypatch.setenv("VLLM_API_KEY", ENGINE)

    def statuses(argv: list[str]) -> dict[str, int]:
        args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
        root = logging.getLogger()
        level, handlers = root.level, list(root.handlers)
        try:  # build_app imports SageMaker's standards package, which sets the root logger's level (to ERROR)
            client = TestClient(build_app(args, supported_tasks=("generate",)), raise_server_exceptions=False)
        finally:
            root.setLevel(level)
            root.handlers[:] = handlers
        return {path: client.post(path, json={"prompt": "hi"}).status_code
                for path in ("/v1/completions", "/invocations", "/detokenize")} | {
            "/metrics": client.get("/metrics").status_code}

    own = statuses([])
    assert own["/v1/completions"] == 401 and own["/invocations"] != 401 and own["/detokenize"] != 401
    guarded = statuses(["--middleware", ENGINE_GUARD])
    assert guarded == {"/v1/completions": 401, "/invocations": 401, "/detokenize": 401, "/metrics": 200}
