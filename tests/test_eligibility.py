"""eligibility.route: which request bodies take the first token from prefill, and why the others do not. What each
allowed field means on real servers is tests/test_served_request_fields.py's table; here the rules themselves."""

from __future__ import annotations

import pytest

from hybridserve.core.proxy.eligibility import UNKNOWN_FIELD, route

PLAIN = {"model": "m", "prompt": "hi", "max_tokens": 4}


def _reason(body: dict, path: str = "/v1/completions") -> str | None:
    found = route(path, body)
    assert found.is_first_token is (found.reason is None)
    return found.reason


@pytest.mark.parametrize("stop,eligible", [(None, True), ("\n", True), (["\n", "."], True), ([], True),
                                           ("\n\n", False), (["\n", "END"], False), ([3], False)],
                         ids=["none", "one-char", "one-char-list", "empty-list", "two-chars", "list-with-three",
                              "not-a-string"])
def test_only_stop_strings_that_cannot_span_two_tokens_keep_the_first_token_path(stop, eligible):
    assert (_reason({**PLAIN, "stop": stop}) is None) is eligible


@pytest.mark.parametrize("extra,reason", [
    ({}, None),
    ({"prompt": [1, 2, 3]}, None),
    ({"prompt": ["a", "b"]}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": None}, "prompt"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": None}, None),
    ({"n": 1, "echo": False, "presence_penalty": 0, "frequency_penalty": 0.0, "bad_words": []}, None),
    ({"n": 2}, "n"),
    ({"n": True}, "n"),  # True == 1 in Python, but it is not vLLM's n
    ({"echo": True}, "echo"),
    ({"presence_penalty": 0.5}, "presence_penalty"),
    ({"bad_words": ["w"]}, "bad_words"),
    ({"structured_outputs": {"choice": ["a", "b"]}}, "structured_outputs"),
    ({"response_format": {"type": "text"}}, None),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"seed": 3, "temperature": 0.0}, None),
    ({"seed": 3, "temperature": 0.7}, "seed"),
    ({"seed": 3}, "seed"),  # the server's default temperature may sample
    ({"vllm_xargs": {"k": 1}}, "vllm_xargs"),
    ({"logit_bias": {"7": 3.0}, "allowed_token_ids": [7], "min_tokens": 3, "logprobs": 2}, None),
], ids=["plain", "prompt-ids", "two-prompts", "empty-ids", "no-prompt", "max-tokens-0", "max-tokens-null",
        "defaults", "n-2", "n-true", "echo", "presence-penalty", "bad-words", "structured-outputs", "format-text",
        "json-object", "seed-greedy", "seed-sampled", "seed-default-temperature", "vllm-xargs", "per-step-fields"])
def test_a_field_keeps_the_path_only_with_a_value_proven_safe(extra, reason):
    assert _reason({**PLAIN, **extra}) == reason


def test_an_unknown_field_goes_two_hops_and_is_named():
    found = route("/v1/completions", {**PLAIN, "zeta": 1, "best_of": 1, "logit_bias": {}})
    assert not found.is_first_token and found.reason == UNKNOWN_FIELD
    assert found.unknown_fields == ("best_of", "zeta")  # best_of: not a completion field of vLLM 0.32


def test_chat_and_other_endpoints_go_two_hops():
    assert _reason({"model": "m", "messages": [], "max_tokens": 4}, "/v1/chat/completions") == "endpoint"



def test_the_benchmarks_streams_keep_the_first_token_path():
    """bench's and served_pd's requests (core/bench/stream.py): their TTFT figures are the first-token path's."""
    from hybridserve.core.bench.stream import request_body

    assert _reason(request_body("m", (1, 2, 3), 64)) is None


def test_the_proxys_own_fields_keep_a_request_on_the_first_token_path_and_are_not_unknown():
    from hybridserve.core.proxy.eligibility import FIRST_TOKEN, route

    body = {"prompt": "hi", "max_tokens": 4, "kv_transfer_params": {"remote_host": "10.0.0.9", "remote_port": 1}}
    assert route("/v1/completions", body) == FIRST_TOKEN  # replaced on both hops: the client's never reaches one
