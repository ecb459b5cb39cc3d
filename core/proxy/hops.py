"""The two hops of a P/D request: prefill with max_tokens=1, then decode with the returned kv_transfer_params.

Every failure becomes a HopError that names the role, the server and why; the app turns it into an HTTP error.
"""

from __future__ import annotations

from typing import Any

import httpx

# What vLLM's NixlConnector expects on the prefill hop (toy_proxy_server.py protocol).
PREFILL_KV_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                     "remote_block_ids": None, "remote_host": None, "remote_port": None}


class HopError(Exception):
    """A hop failed. A 4xx is the client's mistake, refused by the role: it is passed on as that 4xx (a client
    that retries on 5xx must not retry its own mistake); anything else is the role's failure (502/504)."""

    def __init__(self, role: str, url: str, status: int, reason: str, *, is_unsent: bool = False,
                 is_transport: bool = False) -> None:
        verb = "refused the request" if is_client_error(status) else "failed"
        super().__init__(f"{role} server {url} {verb}: {reason}")
        self.role, self.url, self.status, self.reason = role, url, status, reason
        self.is_unsent = is_unsent  # no connection was made: the server never saw the request (failover.py)
        self.is_transport = is_transport  # no HTTP answer at all (refused, broken, timed out)

    @property
    def is_timeout(self) -> bool:
        return self.status == 504

    @property
    def is_client_error(self) -> bool:
        return is_client_error(self.status)

    @property
    def outcome(self) -> str:
        """The proxy's metrics label: `client_error` for a refused request, else `<role>_error`."""
        return "client_error" if self.is_client_error else f"{self.role}_error"

    def body(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.is_client_error else f"{self.role}_failed"
        return {"error": {"message": str(self), "type": kind, "role": self.role, "code": self.status}}


def is_client_error(status: int) -> bool:
    return 400 <= status < 500


def transport_error(role: str, url: str, exc: httpx.HTTPError) -> HopError:
    """No answer: 504 after a timeout, else 502; a connection never made is marked unsent (nothing reached it)."""
    is_unsent = isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout))
    if isinstance(exc, httpx.TimeoutException):
        return HopError(role, url, 504, f"no answer within the timeout ({type(exc).__name__})", is_unsent=is_unsent,
                        is_transport=True)
    return HopError(role, url, 502, f"{type(exc).__name__}: {exc or 'connection lost'}", is_unsent=is_unsent,
                    is_transport=True)


def status_error(role: str, url: str, status: int, text: str) -> HopError:
    """A non-200 answer: a 4xx keeps its status, a 5xx (or anything else) becomes 502 naming the role."""
    return HopError(role, url, status if is_client_error(status) else 502, f"HTTP {status}: {text[:300]}")


def prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    """The prefill hop's body. Shallow copies: only top-level keys change, and the prompt (32k token ids) is shared,
    not copied (a deep copy of a 32k-id prompt took 8.8 ms a hop here, twice per request, P/D only)."""
    out = dict(body)
    out.update(max_tokens=1, stream=False, kv_transfer_params=dict(PREFILL_KV_PARAMS))
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    for key in ("stream_options", "min_tokens"):
        out.pop(key, None)
    return out


def decode_body(body: dict[str, Any], kv_transfer_params: dict[str, Any]) -> dict[str, Any]:
    out = dict(body)
    out["kv_transfer_params"] = kv_transfer_params
    return out


async def post_json(client: httpx.AsyncClient, role: str, url: str, path: str, body: dict[str, Any],
                    headers: dict[str, str]) -> dict[str, Any]:
    """POST and return the JSON answer; any transport error, timeout or non-200 raises HopError."""
    try:
        response = await client.post(f"{url}{path}", json=body, headers=headers)
    except httpx.HTTPError as exc:
        raise transport_error(role, url, exc) from None
    if response.status_code != 200:
        raise status_error(role, url, response.status_code, response.text)
    try:
        return response.json()
    except ValueError:
        raise HopError(role, url, 502, f"answer is not JSON: {response.text[:200]}") from None


async def prefill(client: httpx.AsyncClient, url: str, path: str, body: dict[str, Any],
                  headers: dict[str, str]) -> dict[str, Any]:
    """Run the prefill hop; return the kv_transfer_params the decode hop needs."""
    answer = await post_json(client, "prefill", url, path, prefill_body(body), headers)
    params = answer.get("kv_transfer_params")
    if not isinstance(params, dict):
        raise HopError("prefill", url, 502, "answer has no kv_transfer_params (is it a NixlConnector kv_producer?)")
    return params
