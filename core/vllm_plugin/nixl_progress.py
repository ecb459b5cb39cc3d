"""Give NIXL's UCX progress thread a sleep between polls, so an idle server stops burning a whole core.

nixl's Python `nixl_agent` hard-codes `pthrDelay = 0` in the agent config it hands to the C++ agent; vLLM's
NixlConnector creates its agent with the progress thread on, so each server's progress thread polls with a zero
timeout forever (gdb: `poll(..., timeout=0)` in `nixlUcxSharedThread::run`). On a 2-core box two servers' threads
take both cores. Measured in /work/shared/reference/nixl_cpu.md: a delay of 100-10000 us brings the idle cost to
~1 % with completion still immediate. The progress thread is kept (not switched off): without it, a READ's
completion on the target side is only observed when the target polls, and P/D stalled.

How: the `_api` module's `nixlBind` is replaced by a view of the bindings whose `nixlAgent` constructor sets the
delay on the config first. Nothing else in the bindings changes.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from hybridserve.core.vllm_plugin.import_hooks import after_import
from hybridserve.core.vllm_plugin.log import logger

# nixl's meta package picks one of these builds and aliases it as `nixl._api`.
NIXL_API_MODULES = ("nixl_cu12._api", "nixl_cu13._api", "nixl_rocm._api")


class _BindingsWithDelay:
    """The bindings module, except that new agents get `pthrDelay = delay_us` when their progress thread is on."""

    def __init__(self, bindings: ModuleType, delay_us: int) -> None:
        self._bindings, self._delay_us = bindings, delay_us

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bindings, name)

    def nixlAgent(self, name: str, config: Any) -> Any:  # noqa: N802 (the bindings' name)
        if getattr(config, "useProgThread", False):
            config.pthrDelay = self._delay_us
            logger.info("hybridserve: NIXL agent %s progress thread polls every %d us (was 0: busy spin)",
                        name, self._delay_us)
        return self._bindings.nixlAgent(name, config)


def patch_api_module(module: ModuleType, delay_us: int) -> None:
    bindings = getattr(module, "nixlBind", None)
    if bindings is None or isinstance(bindings, _BindingsWithDelay):
        return
    module.nixlBind = _BindingsWithDelay(bindings, delay_us)


def install(delay_us: int) -> None:
    if delay_us < 0:
        raise ValueError(f"NIXL progress delay must be >= 0 us, got {delay_us}")
    for name in NIXL_API_MODULES:
        after_import(name, lambda module: patch_api_module(module, delay_us))
