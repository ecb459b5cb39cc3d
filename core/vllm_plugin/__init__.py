"""hybridserve's vLLM general plugin (entry point `vllm.general_plugins`: `hybridserve = ...:register`).

vLLM calls `register()` in every process it starts (API server, engine core, workers, the model-inspection
subprocess). One module per fix; each is off unless `hybridserve launch` set its variable (settings.py):

- torchvision_shim: lets vLLM's Qwen3.5 code import PyPI's CUDA torchvision beside CPU torch (always on).
- async_scheduling: keeps `--async-scheduling` on CPU on when asked; logs the engine's scheduler (log always on).
- nixl_progress: a sleep in NIXL's UCX progress thread instead of a busy spin.
- cpu_affinity: keeps the worker's compute thread on the cores launch assigned.
- cpu_conv_layout: repacks the CPU causal-conv input that would otherwise kill the engine (always on).
- transfer_log: one decode-side log line per request whose KV + GDN state arrived over NIXL (always on).
- gdn_dispatch: routes each GDN prefill batch to a tuned profile's winner (`launch --tuned-profile`).
- nixl_poll: a decode-side NIXL READ completion poller and a late per-step poll (off unless HYBRIDSERVE_NIXL_POLL=1).
- timeline: one JSON line per P/D request event into HYBRIDSERVE_TIMELINE_FILE (off unless it is set).
"""

from __future__ import annotations

from hybridserve.core.vllm_plugin import (
    async_scheduling, cpu_affinity, cpu_conv_layout, faults, nixl_poll, nixl_progress, settings, timeline,
    torchvision_shim, transfer_log,
)
from hybridserve.core.vllm_plugin.log import logger


def register() -> None:
    config = settings.from_env()
    if config.is_disabled:
        return
    torchvision_shim.install_lazy()
    async_scheduling.install_scheduler_log()
    transfer_log.install()
    cpu_conv_layout.install()
    faults.install_from_env()  # validate's fault injection: off unless HYBRIDSERVE_FAULT(_FILE) is set
    if timeline.path_from_env() is not None:
        timeline.install(timeline.path_from_env())
    if nixl_poll.poll_us_from_env() is not None:  # HYBRIDSERVE_NIXL_POLL=1: decode sees READ completions on time
        nixl_poll.install(nixl_poll.poll_us_from_env())
    if config.keep_async_scheduling:
        async_scheduling.install_keep_async()
    if config.nixl_progress_delay_us is not None:
        nixl_progress.install(config.nixl_progress_delay_us)
    if config.cpu_cores is not None:
        cpu_affinity.install(config.cpu_cores)
    if config.gdn_dispatch_profile is not None:
        from hybridserve.core.vllm_plugin import gdn_dispatch

        gdn_dispatch.install(config.gdn_dispatch_profile, is_log_calls=config.is_gdn_dispatch_log_calls)
    logger.debug("hybridserve plugin registered: %s", config)
