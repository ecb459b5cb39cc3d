"""The shims launch arms in each server process through its startup folder (core/vllm_plugin/startup), for Ray's
processes: Ray's LLM code imports vLLM, and vLLM torchvision, and a Ray worker imports it when it unpickles a
replica's class (Ray's ingress is one), before anything of the project's could run. Two ways in, both kept:
`arm` is the application's `worker_process_setup_hook` (serve_config.py: every worker of the app runs it at start),
and the project's modules that import Ray's LLM code import this module first."""

from hybridserve.core.vllm_plugin import unloadable_extensions
from hybridserve.core.vllm_plugin.torchvision_shim import install_lazy

SETUP_HOOK = "hybridserve.core.rayserve.shims.arm"


_is_armed = False


def arm() -> None:
    """Once a process (the hooks would otherwise run twice)."""
    global _is_armed
    if not _is_armed:
        _is_armed = True
        install_lazy()
        unloadable_extensions.install_lazy()


arm()
