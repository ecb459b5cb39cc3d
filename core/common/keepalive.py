"""How long an idle HTTP connection to a uvicorn server (a vLLM engine, the proxy) is kept for reuse, on each side.

The client drops an idle connection after IDLE_EXPIRY_S (httpx's pool expiry, counted from the client's end of the
last answer). The server closes one after its keep-alive timeout: uvicorn's `timeout_keep_alive`, 5 s by default,
which vLLM's API server takes from VLLM_HTTP_TIMEOUT_KEEP_ALIVE (default 5). A request sent on a connection the
server is closing meets a closed socket (httpx ReadError or "Server disconnected without sending a response").

Two ways to meet it:
- the clocks: the server's starts before the client's; one CI run lost a prefill hop that way. IDLE_EXPIRY_S = 2 s
  leaves 3 s between them;
- a stall: a server whose process or event loop stops (SIGSTOP, a starved CPU) with the client's request already in
  its socket runs its overdue keep-alive timer first when it goes on and resets the connection, request unread. Seen
  here with uvicorn 0.55 on both uvloop 0.23 and asyncio: a connection idle 1 s, the server stopped 8 s, the request
  sent meanwhile: `ReadError: [Errno 104] Connection reset by peer` with the 5 s timeout, answered with 60 s
  (tests/test_keepalive.py). issue 39's probe met it on decode's hop after a 40 s stop, and a busy CPU box stalls a
  server's event loop for seconds (health_watch.py). The proxy then takes a request that was never read for a
  failed one: the hop is retried on another server without prefill's blocks, or fails with no server left.
So the servers keep idle connections longer than any stall a request survives: the proxy's per-hop timeout plus a
margin (`server_idle_s`), set by launch on every engine (VLLM_HTTP_TIMEOUT_KEEP_ALIVE) and by the proxy on itself.
Idle connections still close after IDLE_EXPIRY_S, from the client's side, so the servers hold no more of them.
"""

import math

IDLE_EXPIRY_S = 2.0
SERVER_MARGIN_S = 5.0


def server_idle_s(hop_timeout_s: float) -> int:
    """A server's keep-alive timeout, whole seconds: longer than the longest wait a hop survives (its timeout)."""
    return math.ceil(hop_timeout_s + SERVER_MARGIN_S)
