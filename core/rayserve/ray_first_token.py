"""The first token from prefill (core/proxy/first_token.py) in Ray Serve's terms: the decode replica yields what
Ray's ingress sends on, a CompletionResponse (one answer) or lists of SSE event strings (a stream), instead of the
proxy's HTTP responses. The merging rules are first_token.py's own, unchanged."""

from __future__ import annotations

from hybridserve.core.rayserve import shims  # noqa: F401 (first: before Ray's LLM modules import vLLM)

from collections.abc import AsyncIterator
from typing import Any

from ray.llm._internal.serve.core.configs.openai_api_models import CompletionResponse, ErrorResponse

from hybridserve.core.proxy import first_token


def _texts(events: list[bytes]) -> list[str]:
    return [event.decode() for event in events]


async def alone(first: first_token.FirstToken, body: dict[str, Any]) -> AsyncIterator[Any]:
    """Prefill's answer is the whole completion (its token ended the request)."""
    if body.get("stream"):
        yield _texts(first_token.first_events(first, body))
    else:
        yield CompletionResponse.model_validate(first_token.client_answer(first, body))


async def joined(first: first_token.FirstToken, body: dict[str, Any], local: AsyncIterator[Any],
                 detokenize: first_token.Detokenize, *, is_early: bool = True) -> AsyncIterator[Any]:
    """Token 1 first, then decode's output (`local`: this replica's engine) with token 1 accounted for. A stream
    not `is_early` waits for decode's first chunk: an error there goes to the client alone."""
    repair = None if first.is_text_whole else first_token.TextRepair(first, detokenize)
    if not body.get("stream"):
        async for chunk in local:
            if isinstance(chunk, list):
                chunk = chunk[0]
            if isinstance(chunk, ErrorResponse):
                yield chunk
                return
            decoded = chunk.model_dump()
            text = None
            if repair is not None:
                ids = [*first.token_ids, *(decoded["choices"][0].get("token_ids") or [])]
                text = (await detokenize(ids)).rstrip("\ufffd")
            yield CompletionResponse.model_validate(first_token.merge_answer(first, decoded, body, text))
        return
    if not is_early:
        head = await local.__anext__()
        if isinstance(head, ErrorResponse) or (isinstance(head, list) and isinstance(head[0], ErrorResponse)):
            yield head
            return
        local = _chain(head, local)
    yield _texts(first_token.first_events(first, body))
    async for chunk in local:
        out = []
        for item in chunk if isinstance(chunk, list) else [chunk]:
            out.append(await _rewritten(item, first, body, repair) if isinstance(item, str) else item)
        yield out


async def _rewritten(event: str, first: first_token.FirstToken, body: dict[str, Any],
                     repair: first_token.TextRepair | None) -> str:
    async def one() -> AsyncIterator[bytes]:
        yield event.encode()

    return b"".join([part async for part in first_token.rewrite_stream(one(), first, body, repair)]).decode()


async def _chain(head: Any, rest: AsyncIterator[Any]) -> AsyncIterator[Any]:  # noqa: ANN401
    yield head
    async for chunk in rest:
        yield chunk
