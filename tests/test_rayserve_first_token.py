"""The first token from prefill in Ray's terms (core/rayserve/ray_first_token.py): what the decode replica yields to
Ray's ingress is one server's answer, token 1 (prefill's) and decode's tokens merged as the project's proxy merges
them (core/proxy/first_token.py), for one answer and for a stream; an error of decode's goes out alone."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("ray.llm", reason="needs the ray extra")

from hybridserve.core.rayserve import shims  # noqa: E402, F401 (torchvision, as in the replicas)
from hybridserve.core.proxy import first_token  # noqa: E402
from hybridserve.core.rayserve import ray_first_token  # noqa: E402
from ray.llm._internal.serve.core.configs.openai_api_models import CompletionResponse, ErrorResponse  # noqa: E402

PROMPT = [11, 12, 13, 14]
BODY = {"model": "m", "prompt": PROMPT, "max_tokens": 3, "temperature": 0.0, "return_token_ids": True}


def _prefill_answer() -> dict:
    return {"id": "cmpl-p", "object": "text_completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "text": " a", "logprobs": None, "finish_reason": "length",
                         "token_ids": [21], "prompt_token_ids": PROMPT}],
            "usage": {"prompt_tokens": 4, "completion_tokens": 1, "total_tokens": 5},
            "kv_transfer_params": {"remote_engine_id": "e", "remote_block_ids": [[1]], "do_remote_prefill": True}}


def _first() -> first_token.FirstToken:
    return first_token.FirstToken.parse("ray:prefill", first_token.prefill_body(BODY), _prefill_answer())


def _decoded() -> CompletionResponse:
    return CompletionResponse.model_validate({
        "id": "cmpl-d", "object": "text_completion", "created": 2, "model": "m",
        "choices": [{"index": 0, "text": " b c", "logprobs": None, "finish_reason": "length", "token_ids": [22, 23],
                     "prompt_token_ids": [*PROMPT, 21]}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}})


async def _gen(*chunks):  # noqa: ANN002, ANN202
    for chunk in chunks:
        yield chunk


async def _collect(agen) -> list:  # noqa: ANN001
    return [chunk async for chunk in agen]


async def _never(_ids: list[int]) -> str:
    raise AssertionError("token 1 is a whole character: no detokenize call")


def test_decode_gets_prompt_plus_token_one_and_one_token_fewer():
    decoded = first_token.decode_body(BODY, _first())
    assert decoded["prompt"] == [*PROMPT, 21] and decoded["max_tokens"] == 2
    assert decoded["kv_transfer_params"]["remote_engine_id"] == "e"


def test_one_answer_is_merged_as_one_servers():
    out = asyncio.run(_collect(ray_first_token.joined(_first(), BODY, _gen(_decoded()), _never)))
    assert len(out) == 1 and isinstance(out[0], CompletionResponse)
    choice = out[0].choices[0]
    assert choice.text == " a b c" and choice.token_ids == [21, 22, 23] and choice.prompt_token_ids == PROMPT
    assert (out[0].usage.prompt_tokens, out[0].usage.completion_tokens) == (4, 3)


def test_a_stream_starts_with_token_one_then_decodes_events_rewritten():
    body = {**BODY, "stream": True, "stream_options": {"include_usage": True}}
    event = {"id": "cmpl-d", "object": "text_completion", "created": 2, "model": "m",
             "choices": [{"index": 0, "text": " b", "logprobs": None, "finish_reason": None, "token_ids": [22]}]}
    usage = {"id": "cmpl-d", "object": "text_completion", "created": 2, "model": "m", "choices": [],
             "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}
    local = _gen([f"data: {json.dumps(event)}\n\n"], [f"data: {json.dumps(usage)}\n\n", "data: [DONE]\n\n"])
    out = asyncio.run(_collect(ray_first_token.joined(_first(), body, local, _never)))
    head = json.loads(out[0][0].removeprefix("data: "))
    assert head["choices"][0]["text"] == " a" and head["choices"][0]["token_ids"] == [21]
    assert json.loads(out[1][0].removeprefix("data: "))["choices"][0]["text"] == " b"
    assert json.loads(out[2][0].removeprefix("data: "))["usage"]["prompt_tokens"] == 4  # token 1 counted as output
    assert out[2][1] == "data: [DONE]\n\n"


def test_a_late_stream_sends_decodes_error_alone():
    body = {**BODY, "stream": True}
    error = ErrorResponse(error={"message": "KV load failed", "type": "InternalServerError", "code": 500})
    out = asyncio.run(_collect(ray_first_token.joined(_first(), body, _gen([error]), _never, is_early=False)))
    assert out == [[error]]  # token 1 was held back: the client sees the error, not half an answer


def test_prefills_token_that_ends_the_request_is_the_whole_answer():
    answer = _prefill_answer()
    answer["choices"][0]["finish_reason"] = "stop"
    first = first_token.FirstToken.parse("ray:prefill", first_token.prefill_body(BODY), answer)
    assert first.is_last
    out = asyncio.run(_collect(ray_first_token.alone(first, {**BODY, "return_token_ids": False})))
    assert out[0].choices[0].text == " a" and out[0].choices[0].token_ids is None
