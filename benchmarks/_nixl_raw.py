"""A bare NIXL agent for the NIXL-only benchmarks (no vLLM): the dead peer and the cuda_ipc cache's cost.

Both scripts start a target and an initiator in their own processes and need the same agent there: UCX alone, a
progress thread, and launch's setting for a same-host READ.
"""

from __future__ import annotations

import os

BASE_ENV = {"UCX_CUDA_IPC_ENABLE_GET_ZCOPY": "y", "NIXL_LOG_LEVEL": "WARN"}  # launch's setting for same-host READ


def raw_agent(name: str, env: dict, device: str = "cpu"):  # noqa: ANN201
    """A NIXL agent named `name`, with `env` over BASE_ENV in this process's environment before UCX reads it."""
    os.environ.update(BASE_ENV, **env)
    if device == "cuda":  # a current CUDA context before the agent, as in vLLM's worker (NIXL's memory views need it)
        import torch

        torch.zeros(1, device="cuda")
    import nixl._api as api

    return api.nixl_agent(name, api.nixl_agent_config(enable_prog_thread=True, backends=["UCX"]))
