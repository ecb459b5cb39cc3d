"""One streamed /v1/completions request, timed as vLLM's `bench serve` times it.

TTFT: from sending to the first chunk that carries a token. ITL: the gaps between successive token-carrying
chunks (vLLM bench serve's `itl`). End-to-end: from sending to `[DONE]` (a stream without it failed). The output length comes from the usage
the server reports (`stream_options.include_usage`; `continuous_usage_stats` gives a running count on every chunk,
so a chunk whose text is empty, a partial UTF-8 piece, still counts as a token). `ignore_eos` and `max_tokens`
make the output exactly the length asked for.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class RequestRecord:
    input_tokens: int
    max_output_tokens: int
    output_tokens: int  # as the server counted them (0 on failure)
    start_s: float  # sent, seconds after the phase started
    ttft_s: float | None
    e2e_s: float | None
    itl_s: tuple[float, ...]
    is_probe: bool = False
    error: str | None = None

    @property
    def is_ok(self) -> bool:
        return self.error is None and self.ttft_s is not None


def request_body(model: str, prompt: tuple[int, ...], output_tokens: int) -> dict[str, Any]:
    return {"model": model, "prompt": list(prompt), "max_tokens": output_tokens, "min_tokens": output_tokens,
            "ignore_eos": True, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}


class _Timing:
    """Token arrival times of one stream, fed chunk by chunk."""

    def __init__(self, sent: float) -> None:
        self.sent, self.times, self.num_tokens, self.error = sent, [], 0, None
        self.done: float | None = None  # when [DONE] arrived

    def feed(self, payload: dict[str, Any], now: float) -> None:
        if "error" in payload:
            self.error = str(payload["error"].get("message", payload["error"]))[:300]
            return
        usage = payload.get("usage") or {}
        counted = usage.get("completion_tokens")
        choices = payload.get("choices") or []
        has_text = bool(choices and (choices[0].get("text") or ""))
        grew = isinstance(counted, int) and counted > self.num_tokens
        if choices and (grew or has_text):
            self.times.append(now)
        if isinstance(counted, int):
            self.num_tokens = max(self.num_tokens, counted)
        elif choices and has_text:
            self.num_tokens += 1


async def sse_lines(response: Any):  # noqa: ANN201
    """The stream's lines, split at LF only (SSE's own rule). httpx's aiter_lines also splits at U+0085, U+2028 and
    U+2029, which JSON leaves unescaped: a random-weight model that samples one broke 2 of 48 streams on the H200
    ("not JSON")."""
    pending = b""
    async for chunk in response.aiter_bytes():
        pending += chunk
        while b"\n" in pending:
            raw, pending = pending.split(b"\n", 1)
            yield raw.decode("utf-8", errors="replace").rstrip("\r")
    if pending:
        yield pending.decode("utf-8", errors="replace")


async def stream_one(client: Any, url: str, model: str, prompt: tuple[int, ...], output_tokens: int, *,
                     phase_start: float, is_probe: bool = False) -> RequestRecord:
    """Send one request and time its stream; a failure is recorded (never raised) with the server's reason."""
    import httpx

    sent = time.perf_counter()
    timing = _Timing(sent)
    try:
        async with client.stream("POST", f"{url}/v1/completions",
                                 json=request_body(model, prompt, output_tokens)) as response:
            if response.status_code != 200:
                text = (await response.aread())[:300].decode(errors="replace")
                timing.error = f"HTTP {response.status_code}: {text}"
            else:
                async for line in sse_lines(response):
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        timing.done = time.perf_counter()
                        break
                    try:
                        timing.feed(json.loads(data), time.perf_counter())
                    except ValueError:
                        timing.error = f"not JSON: {data[:100]}"
    except httpx.HTTPError as exc:
        timing.error = f"{type(exc).__name__}: {exc or 'connection lost'}"
    if timing.done is None and timing.error is None:  # a server that dies just closes the stream
        timing.error = "stream ended without [DONE]"
    end = timing.done or time.perf_counter()
    times = timing.times
    return RequestRecord(
        input_tokens=len(prompt), max_output_tokens=output_tokens,
        output_tokens=0 if timing.error else timing.num_tokens, start_s=sent - phase_start,
        ttft_s=times[0] - sent if times and not timing.error else None,
        e2e_s=end - sent if not timing.error else None,
        itl_s=tuple(b - a for a, b in zip(times, times[1:])) if not timing.error else (),
        is_probe=is_probe, error=timing.error if timing.error or times else "no token streamed")
