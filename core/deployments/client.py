"""A small OpenAI-compatible completions client: greedy, with the top-k logprobs of every generated token."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from hybridserve.core.common import keepalive
from hybridserve.core.common.errors import CouldNotRunError, MissingExtraError

NUM_TOP_LOGPROBS = 2  # enough to tell a near-tie: the gap between the best and the second-best token
MAX_TOP_LOGPROBS = 20  # vLLM's default --max-logprobs


@dataclass(frozen=True, kw_only=True)
class Completion:
    text: str
    tokens: tuple[str, ...]
    logprobs: tuple[float, ...]  # of the chosen token, per position
    top2_gaps: tuple[float | None, ...]  # best minus second-best logprob per position; None if only one was returned
    top: tuple[dict[str, float], ...] = ()  # the top-k tokens and their logprobs, per position
    error: str | None = None  # the endpoint refused this prompt (HTTP error or a malformed answer)


class RequestRejectedError(CouldNotRunError):
    """The endpoint answered, but not with a completion: an HTTP error status or a malformed body."""


@dataclass(frozen=True, kw_only=True)
class RequestSettings:
    max_tokens: int = 8
    timeout_s: float = 120.0
    concurrency: int = 4
    ignore_eos: bool = False  # vLLM extension; only sent when True
    model: str | None = None  # None: the first model the endpoint lists
    num_top_logprobs: int = NUM_TOP_LOGPROBS  # vLLM completions `logprobs=k`
    # vLLM's return_tokens_as_token_ids: tokens come back as 'token_id:N', so two ids that decode to the same text
    # (byte pieces, ids a small tokenizer does not hold) stay apart in the top-k; only sent when True
    is_token_ids: bool = False
    api_key: str | None = field(default=None, repr=False)  # the candidate's front key, sent to it only


def _httpx() -> Any:
    try:
        import httpx
    except ImportError as exc:
        raise MissingExtraError("httpx", "cpu", "validate") from exc
    return httpx


def _fail(url: str, what: str) -> CouldNotRunError:
    return CouldNotRunError(f"endpoint {url}: {what}")


def _request(client: Any, url: str, method: str, path: str, body: dict | None = None) -> dict:
    httpx = _httpx()
    try:
        response = client.request(method, f"{url}{path}", json=body)
    except httpx.TimeoutException:
        raise _fail(url, f"{method} {path} timed out") from None
    except httpx.HTTPError as exc:
        raise _fail(url, f"{method} {path} failed: {exc}") from None
    if response.status_code != 200:
        raise RequestRejectedError(f"endpoint {url}: {method} {path} answered HTTP {response.status_code}: "
                                   f"{response.text[:300]}")
    try:
        return response.json()
    except ValueError:
        raise RequestRejectedError(f"endpoint {url}: {method} {path} did not answer JSON") from None


def parse_completion(url: str, payload: dict) -> Completion:
    """One `/v1/completions` response with `logprobs` -> Completion (raises CouldNotRunError if malformed)."""
    try:
        choice = payload["choices"][0]
        logprobs = choice["logprobs"]
        tokens = tuple(logprobs["tokens"])
        values = tuple(float(v) for v in logprobs["token_logprobs"])
        tops = logprobs.get("top_logprobs") or [None] * len(tokens)
    except (KeyError, IndexError, TypeError, ValueError):
        raise RequestRejectedError(f"endpoint {url}: the completion has no logprobs (is it an OpenAI-compatible "
                                   "/v1/completions?)") from None
    gaps = []
    for top in tops:
        ranked = sorted((top or {}).values(), reverse=True)
        # One entry although two were asked: the two best tokens decode to the same text (byte pieces): a tie.
        gaps.append(ranked[0] - ranked[1] if len(ranked) >= 2 else (0.0 if len(ranked) == 1 else None))
    return Completion(text=choice.get("text") or "", tokens=tokens, logprobs=values, top2_gaps=tuple(gaps),
                      top=tuple({str(k): float(v) for k, v in (t or {}).items()} for t in tops))


def first_model(client: Any, url: str) -> str:
    models = _request(client, url, "GET", "/v1/models").get("data") or []
    if not models:
        raise _fail(url, "/v1/models lists no model")
    return str(models[0]["id"])


def auth_headers(api_key: str | None) -> dict[str, str] | None:
    """OpenAI clients' header for a deployment's front key (core/proxy/auth.py); None for an open one."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else None


def complete_all(url: str, prompts: Sequence[str | Sequence[int]], settings: RequestSettings,
                 on_done: Callable[[], None] | None = None) -> list[Completion]:
    """Send every prompt (greedy, logprobs) with `settings.concurrency` in flight; results in prompt order."""
    httpx = _httpx()
    url = url.rstrip("/")
    with httpx.Client(timeout=settings.timeout_s, headers=auth_headers(settings.api_key),
                      limits=httpx.Limits(keepalive_expiry=keepalive.IDLE_EXPIRY_S)) as client:
        model = settings.model or first_model(client, url)

        def one(prompt: str | Sequence[int]) -> Completion:
            body = {"model": model, "prompt": prompt if isinstance(prompt, str) else list(prompt),
                    "max_tokens": settings.max_tokens, "temperature": 0.0, "logprobs": settings.num_top_logprobs,
                    "seed": 0}
            if settings.ignore_eos:
                body["ignore_eos"] = True
            if settings.is_token_ids:
                body["return_tokens_as_token_ids"] = True
            try:
                completion = parse_completion(url, _request(client, url, "POST", "/v1/completions", body))
            except RequestRejectedError as exc:  # a per-prompt failure; unreachable endpoints still raise
                completion = Completion(text="", tokens=(), logprobs=(), top2_gaps=(), error=str(exc))
            if on_done is not None:
                on_done()
            return completion

        with ThreadPoolExecutor(max_workers=max(1, settings.concurrency)) as pool:
            return list(pool.map(one, prompts))
