"""The chaos bench's bounded load and its KV sampler: a few client threads sending completions back to back (every
other one streamed), each one recorded as the client saw it (its tokens and top-2 logprobs too, to be judged against
one server's answer: tally.py), and every engine's `vllm:kv_cache_usage_perc` twice a second. The prompts come from
a small pool, so that one server's greedy answer to each can be asked once. Threads, not asyncio: the load must go
on while the bench kills and waits in its own thread.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from dataclasses import dataclass

import httpx

from hybridserve.core.common import keepalive
from hybridserve.core.common.contracts import REQUEST_ID_HEADER
from hybridserve.core.deployments.client import Completion, RequestRejectedError, parse_completion

FAILED_PAUSE_S = 0.2  # a client's pause after a failed request
ERROR_CHARS = 300  # of what a failed request was told, kept
_KV_USAGE = re.compile(r"^vllm:kv_cache_usage_perc(?:\{[^}]*\})? ([0-9.eE+-]+)$", re.M)


@dataclass(frozen=True, kw_only=True)
class Sent:
    """One request as the client saw it (times: time.time())."""

    rid: str  # the X-Request-Id it carried (the proxy's timeline is keyed by it)
    start: float
    end: float
    first_byte: float | None  # a stream's first event
    status: int | None  # None: no HTTP answer
    is_stream: bool
    is_ok: bool  # 200 with a whole answer ([DONE] and no error event for a stream)
    error_role: str | None  # the role an error names; "proxy" when the front door itself failed
    is_refused: bool  # the connection to the front door was refused (nothing sent)
    error: str | None = None  # what the client was told (an error's message, or the transport's exception), cut
    prompt_index: int = 0  # in the load's prompt pool
    answer: Completion | None = None  # an OK answer's tokens and logprobs (None: failed, or no logprobs came)


class Load:
    """`num_clients` threads, each sending one request after the other until stopped; `pause()` holds them."""

    def __init__(self, url: str, model: str, prompts: list[str | list[int]], *, num_clients: int = 3,
                 max_tokens: int = 24, timeout_s: float = 60.0, max_requests: int = 20000) -> None:
        self.url, self.model, self.max_tokens, self.timeout_s = url, model, max_tokens, timeout_s
        self.prompts, self.max_requests = prompts, max_requests
        self.sent: list[Sent] = []
        self._go, self._stop = threading.Event(), threading.Event()
        self._go.set()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(num_clients)]

    def start(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def pause(self) -> None:
        self._go.clear()

    def resume(self) -> None:
        self._go.set()

    def stop(self) -> list[Sent]:
        self._stop.set()
        self._go.set()
        for thread in self._threads:
            thread.join(timeout=self.timeout_s + 5)
        return list(self.sent)

    def body(self, index: int, *, is_stream: bool = False) -> dict:
        """The request of pool prompt `index`: greedy, a fixed length, the top-2 logprobs of every token, tokens as
        ids (two ids that decode to the same text stay two: validate's `is_token_ids`)."""
        return {"model": self.model, "prompt": self.prompts[index], "max_tokens": self.max_tokens, "temperature": 0.0,
                "ignore_eos": True, "logprobs": 2, "return_tokens_as_token_ids": True, "stream": is_stream}

    def _client(self, index: int) -> None:
        limits = httpx.Limits(keepalive_expiry=keepalive.IDLE_EXPIRY_S)
        with httpx.Client(timeout=self.timeout_s, limits=limits) as client:
            for n in range(self.max_requests):
                self._go.wait()
                if self._stop.is_set() or len(self.sent) >= self.max_requests:
                    return
                one = self.send(client, is_stream=(index + n) % 2 == 1,
                                prompt_index=(index + n * len(self._threads)) % len(self.prompts))
                with self._lock:
                    self.sent.append(one)
                if not one.is_ok:
                    time.sleep(FAILED_PAUSE_S)  # a front end that fails at once must not be asked thousands of times

    def send(self, client: httpx.Client, *, is_stream: bool, prompt_index: int) -> Sent:
        rid = uuid.uuid4().hex
        body = self.body(prompt_index, is_stream=is_stream)
        start, first, status, ok, role, refused, error, answer = time.time(), None, None, False, None, False, None, None
        try:
            with client.stream("POST", f"{self.url}/v1/completions", json=body,
                               headers={REQUEST_ID_HEADER: rid}) as response:
                status = response.status_code
                if is_stream and status == 200:
                    first, ok, role, error, answer = _read_stream(response)
                else:
                    payload = json.loads(response.read() or b"{}")
                    ok = status == 200 and bool(payload.get("choices"))
                    if ok:
                        answer = _completion(payload)
                    else:
                        role = (payload.get("error") or {}).get("role") or "unknown"
                        error = _told(payload)
        except httpx.ConnectError as err:
            role, refused, error = "proxy", True, f"{type(err).__name__}: {err}"[:ERROR_CHARS]
        except (httpx.HTTPError, ValueError) as err:
            role, error = "proxy", f"{type(err).__name__}: {err}"[:ERROR_CHARS]
        return Sent(rid=rid, start=start, end=time.time(), first_byte=first, status=status, is_stream=is_stream,
                    is_ok=ok, error_role=role, is_refused=refused, error=error, prompt_index=prompt_index,
                    answer=answer)


def _completion(payload: dict) -> Completion | None:
    try:
        return parse_completion("load", payload)
    except RequestRejectedError:  # an answer without logprobs: counted ok, judged by nothing
        return None


def _told(answer: dict) -> str:
    """An error answer's message (the proxy's and vLLM's: {"error": {"message": ...}}), else the answer itself."""
    error = answer.get("error")
    message = error.get("message") if isinstance(error, dict) else None
    return str(message or answer)[:ERROR_CHARS]


def _read_stream(response: httpx.Response) -> tuple[float | None, bool, str | None, str | None, Completion | None]:
    """(time of the first event, whole and clean, the role an error event names, its message, the answer)."""
    first, done, role, error = None, False, None, None
    text, logprobs = [], {"tokens": [], "token_logprobs": [], "top_logprobs": []}
    for line in response.iter_lines():
        if not line.startswith("data: "):
            continue
        first = first or time.time()
        if line == "data: [DONE]":
            done = True
        elif line.startswith('data: {"error"'):
            answer = json.loads(line[6:])
            role, error = (answer.get("error") or {}).get("role") or "unknown", _told(answer)
        else:
            choice = (json.loads(line[6:]).get("choices") or [{}])[0]
            text.append(choice.get("text") or "")
            for key, values in logprobs.items():
                values += (choice.get("logprobs") or {}).get(key) or []
    if role is None and not done:
        role, error = "proxy", "the stream ended without [DONE]"
    is_ok = done and role is None
    answer = _completion({"choices": [{"text": "".join(text), "logprobs": logprobs}]}) if is_ok else None
    return first, is_ok, role, error, answer


class KvSampler:
    """Every engine's KV cache usage every `every_s`: (time, name, fraction or None when it did not answer)."""

    def __init__(self, engines: dict[str, str], every_s: float = 0.5) -> None:
        self.engines, self.every_s = engines, every_s
        self.samples: list[tuple[float, str, float | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> KvSampler:
        self._thread.start()
        return self

    def stop(self) -> list[tuple[float, str, float | None]]:
        self._stop.set()
        self._thread.join(timeout=10)
        return list(self.samples)

    def latest(self, name: str) -> float | None:
        values = [v for _, n, v in self.samples if n == name]
        return values[-1] if values else None

    def _run(self) -> None:
        with httpx.Client(timeout=2.0) as client:
            while not self._stop.is_set():
                for name, url in self.engines.items():
                    self.samples.append((time.time(), name, kv_usage(client, url)))
                self._stop.wait(self.every_s)


def kv_usage(client: httpx.Client, url: str) -> float | None:
    try:
        found = _KV_USAGE.search(client.get(f"{url}/metrics").text)
    except httpx.HTTPError:
        return None
    return float(found.group(1)) if found else None
