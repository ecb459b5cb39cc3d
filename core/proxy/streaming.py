"""Relay the decode server's SSE stream, and turn a stream that stops early into an error event.

A decode server killed mid-stream just closes the connection: the client gets no `data: [DONE]` and no error
(measured with stock vLLM). The relay watches for `[DONE]`; when the stream breaks or ends without it, it sends
one `data: {"error": ...}` event naming the decode server, so the client always learns the request failed.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx

DONE_LINE = b"data: [DONE]"


def error_event(url: str, reason: str, *, status: int = 502, role: str = "decode") -> bytes:
    """A 4xx `status`: the role refused the request (after token 1 went out); anything else: it failed. The role is
    decode, or prefill when it serves a request alone (failover.py)."""
    is_refusal = 400 <= status < 500
    message = f"{role} server {url} {'refused the request' if is_refusal else 'failed'}: {reason}"
    kind = "invalid_request_error" if is_refusal else f"{role}_failed"
    payload = {"error": {"message": message, "type": kind, "role": role, "code": status}}
    return f"data: {json.dumps(payload)}\n\n".encode()


async def relay(response: httpx.Response, url: str, role: str = "decode") -> AsyncIterator[bytes]:
    """Yield the stream's bytes unchanged; end with an error event naming `role` if `[DONE]` never came."""
    tail = b""
    try:
        async for chunk in response.aiter_bytes():
            tail = (tail + chunk)[-64:]
            yield chunk
    except httpx.TimeoutException as exc:
        yield error_event(url, f"no data within the timeout ({type(exc).__name__})", role=role)
        return
    except httpx.HTTPError as exc:
        yield error_event(url, f"stream broken ({type(exc).__name__}: {exc or 'connection lost'})", role=role)
        return
    finally:
        await response.aclose()
    if DONE_LINE not in tail:
        yield error_event(url, "stream ended without [DONE] (server gone?)", role=role)
