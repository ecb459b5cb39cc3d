"""core/chaos/stall.py's queued probe against a fake front door: the probe is sent only once decode streams the long
request, however late that is (the CI flake of 2026-12-05: with a fixed 1 s head start the probe went first)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from hybridserve.core.chaos import stall
from hybridserve.core.deployments.client import Completion

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from _app_threads import served_apps  # noqa: E402
from fastapi import FastAPI, Request  # noqa: E402  (module level: FastAPI resolves the annotations here)
from fastapi.responses import JSONResponse, StreamingResponse  # noqa: E402

ANSWER = " S14 S08"
PREFILL_S = 1.5  # the long request's token 1 comes at once, decode's tokens only this late


def _front_door(seen: dict[str, float]):  # noqa: ANN202
    api = FastAPI()

    @api.post("/v1/completions")
    async def completions(request: Request):  # noqa: ANN202
        body = await request.json()
        if not body.get("stream"):
            seen["probe"] = time.monotonic()
            return JSONResponse({"choices": [{"text": ANSWER}]})

        async def events():  # noqa: ANN202
            yield f"data: {json.dumps({'choices': [{'text': ' x'}]})}\n\n"  # prefill's token 1
            await asyncio.sleep(PREFILL_S)
            for i in range(10):
                if i == 1:
                    seen["decoding"] = time.monotonic()
                yield f"data: {json.dumps({'choices': [{'text': ' y'}]})}\n\n"
                await asyncio.sleep(0.05)
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return api


def test_the_probe_goes_only_once_decode_streams_the_long_request():
    seen: dict[str, float] = {}
    probe = stall.Probe(model="m", prompt="p", is_logprobs=False, timeout_s=30)
    ref = Completion(text=ANSWER, tokens=(), logprobs=(), top2_gaps=())
    with served_apps({"proxy": _front_door(seen)}) as urls:
        queued = stall.queued_past_lease(urls["proxy"], probe, ref, long_max_tokens=10)
    assert queued.result.outcome is stall.Outcome.RIGHT, queued
    assert seen["probe"] >= seen["decoding"], seen  # after decode's second token, not after a fixed head start
    assert queued.long_s >= PREFILL_S and queued.queue_s is None


def test_a_long_request_that_fails_still_lets_the_probe_go():
    probe = stall.Probe(model="m", prompt="p", is_logprobs=False, timeout_s=5)
    ref = Completion(text=ANSWER, tokens=(), logprobs=(), top2_gaps=())
    api = FastAPI()

    @api.post("/v1/completions")
    async def completions():  # noqa: ANN202
        return JSONResponse({"error": "no"}, status_code=500)

    with served_apps({"proxy": api}) as urls:
        start = time.monotonic()
        result = stall.queued_past_lease(urls["proxy"], probe, ref, long_max_tokens=10).result
    assert result.outcome is stall.Outcome.ERROR and result.status == 500, result
    assert time.monotonic() - start < 5  # not held for the probe's whole timeout


def test_tokens_are_counted_from_logprobs_where_a_busy_server_merged_them_into_one_event():
    merged = {"choices": [{"text": " a b c", "logprobs": {"tokens": [" a", " b", " c"]}}]}
    assert stall._streamed_tokens("data: " + json.dumps(merged)) == 3
    assert stall._streamed_tokens("data: " + json.dumps({"choices": [{"text": " a"}]})) == 1
    assert stall._streamed_tokens("data: [DONE]") == 0
    assert stall._streamed_tokens("data: {not json") == 0
    assert stall._streamed_tokens("") == 0
