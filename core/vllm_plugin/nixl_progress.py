"""Arm the NIXL progress-thread delay (core/common/nixl_delay.py) in a vLLM server: NixlConnector's agents."""

from __future__ import annotations

from hybridserve.core.common.nixl_delay import patch_api_module
from hybridserve.core.vllm_plugin.import_hooks import after_import
from hybridserve.core.vllm_plugin.log import logger

# nixl's meta package picks one of these builds and aliases it as `nixl._api`.
NIXL_API_MODULES = ("nixl_cu12._api", "nixl_cu13._api", "nixl_rocm._api")


def _log_agent(name: str, delay_us: int) -> None:
    logger.info("hybridserve: NIXL agent %s progress thread polls every %d us (was 0: busy spin)", name, delay_us)


def install(delay_us: int) -> None:
    if delay_us < 0:
        raise ValueError(f"NIXL progress delay must be >= 0 us, got {delay_us}")
    for name in NIXL_API_MODULES:
        after_import(name, lambda module: patch_api_module(module, delay_us, _log_agent))
