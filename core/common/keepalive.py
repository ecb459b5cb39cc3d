"""How long an HTTP client keeps an idle connection to a uvicorn server (a vLLM engine, the proxy) for reuse."""

# The server closes an idle connection after its keep-alive timeout: uvicorn's `timeout_keep_alive` default of 5 s,
# which vLLM's API server takes from VLLM_HTTP_TIMEOUT_KEEP_ALIVE (default 5) and the proxy leaves at uvicorn's
# default. httpx's own pool expiry is also 5 s, counted from the client's end of the last answer, later than the
# server's: a request sent on such a connection in the gap meets a closed socket (httpx ReadError or "server
# disconnected"). One CI run lost a prefill hop that way (the proxy served that prompt by decode alone). Dropping
# idle connections after 2 s leaves 3 s between the two clocks.
IDLE_EXPIRY_S = 2.0
