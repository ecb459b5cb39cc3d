"""Who may talk to a deployment: a bearer key at a door, as plain ASGI middleware.

- The proxy's front door (`BearerGuard` with the front key, launch's --api-key-file): every path but /health and
  /metrics asks for `Authorization: Bearer <front key>`.
- Each engine (`EngineGuard`, given to vLLM as `--middleware`): every path but /health and /metrics asks for the
  engine key from `VLLM_API_KEY`, which only the proxy holds. vLLM's own check of that variable guards only
  /v1, /v2, /inference and /cohere; its /invocations (which serves completions), /tokenize, /detokenize, /pooling,
  ... stay open without this guard. Without the variable the guard refuses everything but the open paths.

Open on both: /health (launch's start-up wait, load balancers) and /metrics (counters and the engines' URLs, no
prompt and no key; bench and validate scrape the engines' /metrics from the client side). A refusal is a 401 with
an OpenAI-style error body that says nothing about the key; keys are compared as SHA-256 digests in constant time.
"""

from __future__ import annotations

from hybridserve.core.common.contracts import ENGINE_KEY_ENV

import hashlib
import hmac
import json
import logging
import os
from collections.abc import Callable

OPEN_PATHS = frozenset({"/health", "/metrics"})
REFUSAL = {"error": {"message": "Missing or invalid API key: send it as the header 'Authorization: Bearer KEY'.",
                     "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}}
_BODY = json.dumps(REFUSAL).encode()


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).digest()


class BearerGuard:
    """Refuse a request to any path outside OPEN_PATHS without `Authorization: Bearer <key>`. `key` None: refuse
    them all. `on_refused` is called once per refusal (the proxy counts them)."""

    def __init__(self, app, *, key: str | None, on_refused: Callable[[], None] | None = None) -> None:  # noqa: ANN001
        self.app, self.on_refused = app, on_refused
        self._digest = _digest(key) if key else None

    def is_allowed(self, scope: dict) -> bool:
        if scope["path"].removeprefix(scope.get("root_path", "")) in OPEN_PATHS:
            return True
        if self._digest is None:
            return False
        given = next((v.decode("latin-1") for k, v in scope.get("headers", ()) if k == b"authorization"), "")
        scheme, _, token = given.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(_digest(token.strip()), self._digest)

    async def __call__(self, scope: dict, receive, send) -> None:  # noqa: ANN001
        if scope["type"] not in ("http", "websocket") or self.is_allowed(scope):
            await self.app(scope, receive, send)
            return
        if self.on_refused is not None:
            self.on_refused()
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})  # policy violation, before any accept
            return
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer"),
                                (b"content-length", str(len(_BODY)).encode())]})
        await send({"type": "http.response.body", "body": _BODY})


class EngineGuard(BearerGuard):
    """vLLM's `--middleware hybridserve.core.proxy.auth.EngineGuard` (vLLM builds it with the app alone)."""

    def __init__(self, app) -> None:  # noqa: ANN001
        key = os.environ.get(ENGINE_KEY_ENV) or None
        if key is None:
            logging.getLogger("hybridserve").error("EngineGuard: %s is not set; every path but %s refused",
                                                   ENGINE_KEY_ENV, ", ".join(sorted(OPEN_PATHS)))
        super().__init__(app, key=key)


class KeyFileGuard(BearerGuard):
    """A BearerGuard whose key is read from `key_file` where the app starts (Ray's ingress replica, on the proxy's
    host): the key never travels in a config, a pickled app or a log, only the file's path."""

    def __init__(self, app, *, key_file: str) -> None:  # noqa: ANN001
        from pathlib import Path

        from hybridserve.core.launch.keys import read_key  # lazy: vLLM's API server imports this module

        super().__init__(app, key=read_key(Path(key_file), what="api_key_file"))
