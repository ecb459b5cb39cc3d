"""Give NIXL's UCX progress thread a sleep between polls, so an idle agent stops burning a whole core.

nixl's Python `nixl_agent` hard-codes `pthrDelay = 0` in the agent config it hands to the C++ agent, so a progress
thread polls with a zero timeout forever (gdb: `poll(..., timeout=0)` in `nixlUcxSharedThread::run`); on a 2-core
box two such threads take both cores (measured: halves transfer throughput). A delay of 100-10000 us brings the
idle cost to ~1 % with completion still prompt (../shared/reference/nixl_cpu.md). The progress thread is kept: without
it a READ's completion on the target side is only observed when the target polls, and P/D stalls.

One mechanism serves both users: the project's own agents (transfer/agent.py) and vLLM's NixlConnector agents
(the plugin, core/vllm_plugin/nixl_progress.py). The `_api` module's `nixlBind` is replaced by a view of the
bindings whose `nixlAgent` constructor sets the delay on the config first; nothing else in the bindings changes.
"""

from __future__ import annotations

import threading
from types import ModuleType
from typing import Any

DEFAULT_PROGRESS_DELAY_US = 1000  # 1 ms: completions prompt, idle cost 0.03-0.12 CPU-s per 5 s (measured)
_SWAP_LOCK = threading.Lock()


class BindingsWithDelay:
    """The bindings module, except that new agents get `pthrDelay = delay_us` when their progress thread is on."""

    def __init__(self, bindings: Any, delay_us: int, on_agent: Any = None) -> None:
        if delay_us < 0:
            raise ValueError(f"NIXL progress delay must be >= 0 us, got {delay_us}")
        self._bindings, self._delay_us, self._on_agent = bindings, delay_us, on_agent

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bindings, name)

    def nixlAgent(self, name: str, config: Any) -> Any:  # noqa: N802 (the bindings' name)
        if getattr(config, "useProgThread", False):
            config.pthrDelay = self._delay_us
            if self._on_agent is not None:
                self._on_agent(name, self._delay_us)
        return self._bindings.nixlAgent(name, config)


def patch_api_module(module: ModuleType, delay_us: int, on_agent: Any = None) -> None:
    """Every agent the module creates from now on gets the delay (idempotent)."""
    bindings = getattr(module, "nixlBind", None)
    if bindings is None or isinstance(bindings, BindingsWithDelay):
        return
    module.nixlBind = BindingsWithDelay(bindings, delay_us, on_agent)


def create_agent(api: ModuleType, name: str, config: Any, delay_us: int) -> Any:
    """`api.nixl_agent(name, config)` with the delay, leaving the module as it was for other callers."""
    with _SWAP_LOCK:
        original = api.nixlBind
        api.nixlBind = BindingsWithDelay(original, delay_us)
        try:
            return api.nixl_agent(name, config)
        finally:
            api.nixlBind = original
