"""validate and bench against a guarded deployment (launch --api-key-file): the front key from a file, sent to
the candidate (validate) or the deployment (bench) only; the baseline and the scraped engines never see it."""


import json
import random

import pytest
from typer.testing import CliRunner

from _app_threads import served_apps
from hybridserve.cli.app import app

KEY = "front-key-0123456789abcdef"
runner = CliRunner()


def fake_app(guarded: bool, seen: list):
    fastapi = pytest.importorskip("fastapi")
    from hybridserve.core.proxy.auth import BearerGuard

    api = fastapi.FastAPI()

    @api.get("/v1/models")
    def models(request: fastapi.Request):
        seen.append(request.headers.get("authorization"))
        return {"object": "list", "data": [{"id": "fake", "object": "model"}]}

    @api.post("/v1/completions")
    def completions(body: dict, request: fastapi.Request):
        seen.append(request.headers.get("authorization"))
        n = body["max_tokens"]
        tokens = [f"token_id:{sum(body['prompt']) % 50 + i}" for i in range(n)]
        top = [{t: -0.1, "token_id:99": -3.0} for t in tokens]
        return {"choices": [{"text": "", "logprobs": {"tokens": tokens, "token_logprobs": [-0.1] * n,
                                                      "top_logprobs": top}}]}

    if guarded:
        api.add_middleware(BearerGuard, key=KEY)
    return api


@pytest.fixture(scope="module")
def servers():
    pytest.importorskip("uvicorn")
    seen: dict[str, list] = {"open": [], "guarded": []}
    with served_apps({name: fake_app(name == "guarded", seen[name]) for name in seen}) as urls:
        yield {name: (urls[name], seen[name]) for name in seen}


def validate(servers, tmp_path, *extra):
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 64}))
    return runner.invoke(app, ["validate", "--baseline", servers["open"][0], "--candidate", servers["guarded"][0],
                               "--dataset", "random", "--prompt-len", "12", "--num-prompts", "2", "--model",
                               str(tmp_path), "--json", *extra])


def test_validate_sends_the_front_key_to_the_candidate_only(servers, tmp_path):
    (tmp_path / "front.key").write_text(KEY + "\n")
    for _, seen in servers.values():
        seen.clear()
    result = validate(servers, tmp_path, "--api-key-file", str(tmp_path / "front.key"))
    assert result.exit_code == 0, result.output
    assert set(servers["guarded"][1]) == {f"Bearer {KEY}"} and set(servers["open"][1]) == {None}
    assert KEY not in result.output


def test_validate_without_the_key_cannot_run_and_says_so_in_one_line(servers, tmp_path):
    result = validate(servers, tmp_path)
    assert result.exit_code == 2 and "401" in result.output and "Traceback" not in result.output, result.output


def test_a_bad_key_file_is_named_not_printed(servers, tmp_path):
    (tmp_path / "short.key").write_text("abc")
    result = validate(servers, tmp_path, "--api-key-file", str(tmp_path / "short.key"))
    assert result.exit_code == 2 and "short.key" in result.output and "abc" not in result.output.replace(
        str(tmp_path), "")


def test_bench_streams_carry_the_key_given_and_no_other_header():
    import httpx

    from hybridserve.core.bench.driver import run_phase
    from hybridserve.core.bench.lengths import LengthDist
    from hybridserve.core.bench.load import make_load
    from hybridserve.core.bench.phase import PhaseSpec, draw_work

    seen = []

    def handler(request):
        seen.append(request.headers.get("authorization"))
        chunk = {"choices": [{"text": "x"}], "usage": {"completion_tokens": 1}}
        return httpx.Response(200, content=f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode())

    spec = PhaseSpec(load=make_load(None, None), num_requests=3,
                     input_len=LengthDist(min_tokens=4, max_tokens=4), output_len=LengthDist(min_tokens=1, max_tokens=1))
    work = draw_work(spec, random.Random(0))
    prompts = tuple((1, 2, 3, 4) for _ in range(3))
    run_phase("http://fake", "m", work, prompts, (), timeout_s=5, transport=httpx.MockTransport(handler),
              headers={"Authorization": f"Bearer {KEY}"})
    run_phase("http://fake", "m", work, prompts, (), timeout_s=5, transport=httpx.MockTransport(handler))
    assert seen == [f"Bearer {KEY}"] * 3 + [None] * 3
