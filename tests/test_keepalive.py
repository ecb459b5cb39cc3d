"""The clients drop an idle connection well before a uvicorn server closes it (core/common/keepalive.py)."""

import inspect

import uvicorn

from hybridserve.core.common import keepalive


def test_idle_expiry_is_below_the_server_keepalive_of_vllm_and_of_the_proxy():
    vllm_envs = __import__("pytest").importorskip("vllm.envs")
    server_timeouts = {
        "vLLM API server (VLLM_HTTP_TIMEOUT_KEEP_ALIVE)": vllm_envs.VLLM_HTTP_TIMEOUT_KEEP_ALIVE,
        "uvicorn default (the proxy)": inspect.signature(uvicorn.Config).parameters["timeout_keep_alive"].default,
    }
    for server, timeout_s in server_timeouts.items():
        assert timeout_s - keepalive.IDLE_EXPIRY_S >= 2.0, (server, timeout_s)
