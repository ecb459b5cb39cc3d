"""Runs at the start of every Python process of a server `hybridserve launch` started (PYTHONPATH entry).

vLLM imports torchvision before it loads plugins (API server, model-inspection subprocess), so the torchvision
shim is armed here: it only acts if and when torchvision is imported. So is the guard that lets torchaudio and
torchcodec builds that cannot load beside this torch count as absent (unloadable_extensions.py). Nothing else happens
at startup.
"""

try:
    from hybridserve.core.vllm_plugin import unloadable_extensions
    from hybridserve.core.vllm_plugin.torchvision_shim import install_lazy

    install_lazy()
    unloadable_extensions.install_lazy()
except Exception:  # noqa: BLE001 (never break interpreter start-up; vLLM's own error will say what failed)
    pass
