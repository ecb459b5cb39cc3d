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


def error_event(url: str, reason: str) -> bytes:
    message = f"decode server {url} failed: {reason}"
    payload = {"error": {"message": message, "type": "decode_failed", "role": "decode", "code": 502}}
    return f"data: {json.dumps(payload)}\n\n".encode()


async def relay(response: httpx.Response, url: str) -> AsyncIterator[bytes]:
    """Yield the decode stream's bytes unchanged; end with an error event if `[DONE]` never came."""
    tail = b""
    try:
        async for chunk in response.aiter_bytes():
            tail = (tail + chunk)[-64:]
            yield chunk
    except httpx.TimeoutException as exc:
        yield error_event(url, f"no data within the timeout ({type(exc).__name__})")
        return
    except httpx.HTTPError as exc:
        yield error_event(url, f"stream broken ({type(exc).__name__}: {exc or 'connection lost'})")
        return
    finally:
        await response.aclose()
    if DONE_LINE not in tail:
        yield error_event(url, "stream ended without [DONE] (server gone?)")
