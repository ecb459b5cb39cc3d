"""The shims launch arms in each server process through its startup folder (core/vllm_plugin/startup), for the
processes where the project's own modules import Ray's LLM code (which imports vLLM, and vLLM torchvision): the
launch process, tests. Ray's workers get the startup folder itself (serve_config.startup_path): a worker unpickles a
replica's arguments, which import vLLM, before any module of the project runs. (Ray's `worker_process_setup_hook`
in the application's runtime_env did not run in Serve's replicas: Ray's ingress still failed on torchvision.)"""

from hybridserve.core.vllm_plugin import unloadable_extensions
from hybridserve.core.vllm_plugin.torchvision_shim import install_lazy

_is_armed = False


def arm() -> None:
    """Once a process (the hooks would otherwise run twice)."""
    global _is_armed
    if not _is_armed:
        _is_armed = True
        install_lazy()
        unloadable_extensions.install_lazy()


arm()
