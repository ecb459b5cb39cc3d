"""Probes of prefill's KV lease on a running P/D deployment (issue 39), each judged against prefill's own greedy answer:

- `stalled_decode`: decode's processes SIGSTOPped, a greedy completion sent through the front door, other prompts
  sent straight to prefill once the lease is over (vLLM reuses freed blocks last in, first out: BlockPool.free_blocks),
  then SIGCONT: decode meets the request only after prefill freed and reused its blocks;
- `late_decode_hop`: vLLM's own two hops with no proxy, the decode hop sent only after the lease and the reuse;
- `queued_past_lease`: a request that waits in decode's queue (behind a long one, decode serving one sequence at a
  time) longer than the lease, while decode runs and sends heartbeats.
A probe's outcome is right (the reference's answer under validate's near-tie rules), wrong (HTTP 200 with another
answer: what must never happen) or an error (a clear refusal).
"""

from __future__ import annotations

import enum
import json
import os
import signal
import threading
import time
from dataclasses import dataclass

import httpx

from hybridserve.core.bench.scrape import settled_scrape
from hybridserve.core.common.errors import CouldNotRunError
from hybridserve.core.deployments.client import Completion, parse_completion
from hybridserve.core.validate.judge import wrong_reason
from hybridserve.core.validate.thresholds import Thresholds

REUSE_AFTER_S = 1.5  # past the lease's end before the other prompts go to prefill (its reaper runs every step)


class Outcome(enum.Enum):
    RIGHT = "right"
    WRONG = "wrong"
    ERROR = "error"


@dataclass(frozen=True, kw_only=True)
class ProbeResult:
    outcome: Outcome
    status: int | None
    text: str  # the answer's text, or what the client was told
    why: str | None  # why it is wrong, or the error
    seconds: float


@dataclass(frozen=True, kw_only=True)
class Probe:
    model: str
    prompt: str | list[int]
    max_tokens: int = 16
    thresholds: Thresholds = Thresholds()
    timeout_s: float = 180.0
    # top-2 logprobs asked (judged under validate's near-tie rules); False: as issue 39's client asked, the text
    # judged exactly (a trained model's greedy answer; without the guard a READ of reused blocks then answers 200)
    is_logprobs: bool = True
    # tokens as ids, as the chaos load asks (load.py): a reference asked that way is compared id for id
    is_token_ids: bool = False

    def body(self, **more: object) -> dict:
        body = {"model": self.model, "prompt": self.prompt, "max_tokens": self.max_tokens, "temperature": 0.0,
                "ignore_eos": True, **({"logprobs": 2} if self.is_logprobs else {}),
                **({"return_tokens_as_token_ids": True} if self.is_token_ids else {})}
        return {**body, **more}


def ask(url: str, body: dict, timeout_s: float) -> tuple[int | None, dict | str]:
    try:
        response = httpx.post(f"{url}/v1/completions", json=body, timeout=timeout_s)
    except httpx.HTTPError as exc:
        return None, f"{type(exc).__name__}: {exc}"
    try:
        return response.status_code, response.json()
    except ValueError:
        return response.status_code, response.text[:300]


def reference(prefill_url: str, probe: Probe) -> Completion:
    """Prefill's own greedy answer to the probe's prompt (a plain request: one server computes it all)."""
    status, answer = ask(prefill_url, probe.body(logprobs=2), probe.timeout_s)
    if status != 200 or not isinstance(answer, dict):
        raise RuntimeError(f"prefill {prefill_url} did not answer the reference: {status} {answer}")
    return parse_completion(prefill_url, answer)


def judge(probe: Probe, ref: Completion, status: int | None, answer: dict | str, seconds: float) -> ProbeResult:
    if status != 200 or not isinstance(answer, dict) or not answer.get("choices"):
        told = answer.get("error", answer) if isinstance(answer, dict) else answer
        return ProbeResult(outcome=Outcome.ERROR, status=status, text=str(told)[:300], why=str(told)[:300],
                           seconds=round(seconds, 2))
    if probe.is_logprobs:
        got = parse_completion("probe", answer)
        text, why = got.text, wrong_reason(ref, got, probe.thresholds)
    else:
        text = answer["choices"][0].get("text") or ""
        why = None if text == ref.text else f"{text!r} where the reference has {ref.text!r}"
    return ProbeResult(outcome=Outcome.WRONG if why else Outcome.RIGHT, status=status, text=text, why=why,
                       seconds=round(seconds, 2))


def reuse(prefill_url: str, probe: Probe, count: int) -> None:
    """`count` other prompts straight to prefill: plain requests that take the blocks it just freed."""
    for i in range(count):
        ask(prefill_url, {**probe.body(max_tokens=4), "prompt": f"w{100 + i:03d} w{200 + i:03d} w{300 + i:03d} S0{i}"
                          if isinstance(probe.prompt, str) else [3 + (i * 7 + j) % 900 for j in range(64)]},
            probe.timeout_s)


def stalled_decode(front_url: str, prefill_url: str, decode_pgid: int, probe: Probe, ref: Completion, *,
                   stop_s: float, lease_s: float, num_reuse: int = 3, decode_url: str | None = None) -> ProbeResult:
    """`front_url`: the proxy; with `decode_url`, vLLM's own two hops instead (prefill's hop, then the decode hop
    sent at once to the stopped decode): no proxy timeout or fallback in the way."""
    got: dict[str, object] = {}

    def send() -> None:
        start = time.monotonic()
        if decode_url is None:
            got["status"], got["answer"] = ask(front_url, probe.body(), probe.timeout_s)
        else:
            params = first_hop(prefill_url, probe)
            got["status"], got["answer"] = ask(decode_url, probe.body(kv_transfer_params=params), probe.timeout_s)
        got["seconds"] = time.monotonic() - start

    stopped = time.monotonic()
    os.killpg(decode_pgid, signal.SIGSTOP)
    try:
        thread = threading.Thread(target=send, daemon=True)
        thread.start()
        time.sleep(max(0.0, stopped + lease_s + REUSE_AFTER_S - time.monotonic()))
        reuse(prefill_url, probe, num_reuse)
        time.sleep(max(0.0, stopped + stop_s - time.monotonic()))
    finally:
        os.killpg(decode_pgid, signal.SIGCONT)
    thread.join(probe.timeout_s + 10)
    return judge(probe, ref, got.get("status"), got.get("answer", "no answer"), float(got.get("seconds", 0.0)))


def first_hop(prefill_url: str, probe: Probe) -> dict:
    """vLLM's prefill hop (do_remote_decode, one token): the kv_transfer_params the decode hop needs."""
    status, answer = ask(prefill_url, probe.body(max_tokens=1, kv_transfer_params={
        "do_remote_decode": True, "do_remote_prefill": False}), probe.timeout_s)
    if status != 200 or not isinstance(answer, dict) or not answer.get("kv_transfer_params"):
        raise RuntimeError(f"prefill {prefill_url} did not answer the first hop: {status} {answer}")
    return answer["kv_transfer_params"]


def late_decode_hop(prefill_url: str, decode_url: str, probe: Probe, ref: Completion, *, lease_s: float,
                    num_reuse: int = 3) -> ProbeResult:
    start = time.monotonic()
    params = first_hop(prefill_url, probe)
    time.sleep(max(0.0, start + lease_s + REUSE_AFTER_S - time.monotonic()))
    reuse(prefill_url, probe, num_reuse)
    status, got = ask(decode_url, probe.body(kv_transfer_params=params), probe.timeout_s)
    return judge(probe, ref, status, got, time.monotonic() - start)


@dataclass(frozen=True, kw_only=True)
class Queued:
    result: ProbeResult  # the queued probe's
    long_s: float  # the long request's seconds, as its client saw them
    queue_s: float | None  # the probe's time in decode's queue, by decode's own metrics (None without decode_url)


QUEUE_TIME = ("vllm:request_queue_time_seconds_sum", None)  # vLLM's: arrival in the engine to first scheduled


def queued_past_lease(proxy_url: str, probe: Probe, ref: Completion, *, long_max_tokens: int,
                      decode_url: str | None = None, decode_tokens: int = 2) -> Queued:
    """A long request goes first, streamed; the probe is sent once `decode_tokens` of its tokens came after the first
    (the proxy streams token 1 from prefill, core/proxy/first_token.py; the rest come from decode), so that it waits
    in decode's queue while the long one runs (decode serving one sequence at a time). Tokens are counted, not
    events: a busy vLLM API server merges a request's pending outputs into one event. A fixed head start did not
    make sure of the order: on a loaded 2-core CI machine the probe once went first. With `decode_url`, decode's
    queue time of the two requests (the long one's is nearly 0) is read from its /metrics before and after."""
    seconds: list[float] = []
    decoding = threading.Event()

    def long_one() -> None:
        start, tokens = time.monotonic(), 0
        try:
            with httpx.stream("POST", f"{proxy_url}/v1/completions", timeout=probe.timeout_s,
                              json=probe.body(max_tokens=long_max_tokens, stream=True)) as response:
                for line in response.iter_lines():
                    tokens += _streamed_tokens(line)
                    if tokens > decode_tokens:
                        decoding.set()
        except httpx.HTTPError:
            pass
        finally:
            seconds.append(time.monotonic() - start)
            decoding.set()  # the probe still goes (and is judged) if the long one failed or was short

    before = _queue_time(decode_url)
    thread = threading.Thread(target=long_one, daemon=True)
    thread.start()
    decoding.wait(probe.timeout_s)
    start = time.monotonic()
    status, answer = ask(proxy_url, probe.body(), probe.timeout_s)
    result = judge(probe, ref, status, answer, time.monotonic() - start)
    thread.join(probe.timeout_s + 10)
    after = _queue_time(decode_url)
    return Queued(result=result, long_s=round(seconds[0], 2) if seconds else -1.0,
                  queue_s=None if before is None or after is None else round(after - before, 2))


def _streamed_tokens(line: str) -> int:
    """The tokens one server-sent event of a completion carries (by its logprobs; else 1 for a text event)."""
    if not line.startswith("data:") or line.strip() == "data: [DONE]":
        return 0
    try:
        choice = json.loads(line[len("data:"):])["choices"][0]
    except (ValueError, KeyError, IndexError, TypeError):
        return 0
    tokens = (choice.get("logprobs") or {}).get("tokens")
    return len(tokens) if isinstance(tokens, list) else int(bool(choice.get("text")))


def _queue_time(decode_url: str | None) -> float | None:
    """Decode's summed queue time; read until still (vLLM's API server records a request's stats as its outputs
    arrive, perhaps after the answer went out)."""
    if decode_url is None:
        return None
    try:
        with httpx.Client(timeout=10) as client:
            return settled_scrape(client, (decode_url,), (QUEUE_TIME,)).get(QUEUE_TIME)
    except CouldNotRunError:
        return None
