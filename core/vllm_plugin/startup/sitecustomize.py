"""Runs at the start of every Python process of a server `hybridserve launch` started (PYTHONPATH entry).

vLLM imports torchvision before it loads plugins (API server, model-inspection subprocess), so the torchvision
shim is armed here: it only acts if and when torchvision is imported. Nothing else happens at startup.
"""

try:
    from hybridserve.core.vllm_plugin.torchvision_shim import install_lazy

    install_lazy()
except Exception:  # noqa: BLE001 (never break interpreter start-up; vLLM's own error will say what failed)
    pass
