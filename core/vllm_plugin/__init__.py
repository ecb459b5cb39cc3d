"""hybridserve's vLLM general plugin (entry point `vllm.general_plugins`: `hybridserve = ...:register`).

vLLM calls `register()` in every process it starts (API server, engine core, workers, the model-inspection
subprocess). One module per fix; each is off unless `hybridserve launch` set its variable (switches.py):

- torchvision_shim: lets vLLM's Qwen3.5 code import PyPI's CUDA torchvision beside CPU torch (always on).
- async_scheduling: keeps `--async-scheduling` on CPU on when asked; logs the engine's scheduler (log always on).
- nixl_progress: a sleep in NIXL's UCX progress thread instead of a busy spin.
- cpu_affinity: keeps the worker's compute thread on the cores launch assigned.
- cpu_conv_layout: repacks the CPU causal-conv input that would otherwise kill the engine (always on).
- transfer_log: one decode-side log line per request whose KV + GDN state arrived over NIXL (always on).
- gdn_dispatch: routes each GDN prefill batch to a tuned profile's winner (`launch --tuned-profile`).
- nixl_poll: a decode-side NIXL READ completion poller and a late per-step poll (off unless HYBRIDSERVE_NIXL_POLL=1).
- peer_release: decode gives back a dead prefill's NIXL state (HYBRIDSERVE_RELEASE_DEAD_PEERS=1, launch sets it).
- peer_pin: a CUDA decode holds its live prefills' KV allocations open, so that a READ with cuda_ipc's cache off
  opens none (HYBRIDSERVE_PIN_PEER_REGIONS=1, launch sets it on CUDA decode engines).
- lease_stamp, lease_guard: prefill stamps the end of each request's KV lease; decode reads the blocks only inside it
  (heartbeats it sent extend it) and computes the prompt itself otherwise (HYBRIDSERVE_LEASE_GUARD=1, launch sets it).
- timeline: one JSON line per P/D request event into HYBRIDSERVE_TIMELINE_FILE (off unless it is set).

manifest.py names the vLLM lines and the vLLM names each patch touches. Before anything is patched, the first vLLM
process checks the patches it will install against the installed vLLM's source (compat.py) and refuses the start in
one line when one cannot run there; launch's preflight makes the same check before it starts a server.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping

from hybridserve.core.common.contracts import FAULT_ENV, FAULT_FILE_ENV
from hybridserve.core.vllm_plugin import (
    async_scheduling, cpu_affinity, cpu_conv_layout, faults, lease_guard, lease_stamp, manifest, nixl_poll,
    nixl_progress, peer_pin, peer_release, switches, timeline, torchvision_shim, transfer_log,
)
from hybridserve.core.vllm_plugin.log import logger

CHECKED = "HYBRIDSERVE_PLUGIN_CHECKED"  # set once the check passed: the server's later processes inherit it


def installs(config: switches.PluginSettings,
             env: Mapping[str, str]) -> list[tuple[manifest.PatchSpec, Callable[[], None]]]:
    """The patches a process with this configuration installs, in order, each with its install call."""
    out: list[tuple[manifest.PatchSpec, Callable[[], None]]] = [
        (manifest.TORCHVISION_SHIM, torchvision_shim.install_lazy),
        (manifest.SCHEDULER_LOG, async_scheduling.install_scheduler_log),
        (manifest.TRANSFER_LOG, transfer_log.install),
        (manifest.CPU_CONV_LAYOUT, cpu_conv_layout.install),
    ]
    if env.get(FAULT_ENV, "").strip() or env.get(FAULT_FILE_ENV, "").strip():  # validate's fault injection
        out.append((manifest.FAULTS, faults.install_from_env))
    path = timeline.path_from_env(dict(env))
    if path is not None:
        out.append((manifest.TIMELINE, lambda: timeline.install(path)))
    poll_us = nixl_poll.poll_us_from_env(dict(env))
    if poll_us is not None:  # HYBRIDSERVE_NIXL_POLL=1: decode sees READ completions on time
        out.append((manifest.NIXL_POLL, lambda: nixl_poll.install(poll_us)))
    if config.is_pin_peer_regions and config.is_release_dead_peers:  # a CUDA decode: READs open no allocation
        # only with peer_release: a pin alone would hold a dead prefill's memory until vLLM's engine TTL (an hour);
        # before it: peer_release's wrapper, patched on top, then holds its step lock over the pin's NIXL calls too
        out.append((manifest.PEER_PIN, peer_pin.install))
    if config.is_release_dead_peers:  # decode: a dead prefill's NIXL state (its GPU memory on CUDA) given back
        out.append((manifest.PEER_RELEASE, peer_release.install))
    if config.is_lease_guard:  # both roles: prefill stamps, decode guards (one switch, launch sets it everywhere)
        out += [(manifest.LEASE_STAMP, lease_stamp.install), (manifest.LEASE_GUARD, lease_guard.install)]
    if config.keep_async_scheduling:
        out.append((manifest.KEEP_ASYNC, async_scheduling.install_keep_async))
    if config.nixl_progress_delay_us is not None:
        out.append((manifest.NIXL_PROGRESS, lambda: nixl_progress.install(config.nixl_progress_delay_us)))
    if config.cpu_cores is not None:
        out.append((manifest.CPU_AFFINITY, lambda: cpu_affinity.install(config.cpu_cores)))
    if config.gdn_dispatch_profile is not None:
        def dispatch() -> None:
            from hybridserve.core.vllm_plugin import gdn_dispatch  # lazy: only with a tuned profile

            gdn_dispatch.install(config.gdn_dispatch_profile, is_log_calls=config.is_gdn_dispatch_log_calls)

        out.append((manifest.GDN_DISPATCH, dispatch))
    return out


def armed_specs(env: Mapping[str, str]) -> tuple[manifest.PatchSpec, ...]:
    """The patches a vLLM process started with `env` installs (launch's preflight checks these)."""
    return tuple(spec for spec, _ in installs(switches.from_env(dict(env)), env))


def _refuse_mismatches(specs: list[manifest.PatchSpec], line: str | None) -> None:
    """Once per server (the first vLLM process): one line and exit 2 when a patch cannot run on this vLLM."""
    # lazy here and below: every vLLM process loads the plugin; only the first one checks
    from hybridserve.core.host.vllm_version import installed_vllm
    from hybridserve.core.vllm_plugin import compat

    version = installed_vllm()
    if version is None or os.environ.get(CHECKED):
        return
    mismatches = compat.check(specs, version, compat.installed_index)
    if mismatches:
        logger.error("%s", mismatches[0].message)
        print(mismatches[0].message, file=sys.stderr, flush=True)
        raise SystemExit(2)
    os.environ[CHECKED] = line or "1"


def register() -> None:
    config = switches.from_env()
    if config.is_disabled:
        return
    from hybridserve.core.host.vllm_version import installed_vllm  # lazy: as in _refuse_mismatches
    from hybridserve.core.vllm_plugin.compat import is_supported, line_of

    version = installed_vllm()
    line = line_of(version) if version is not None else None
    chosen = installs(config, os.environ)
    _refuse_mismatches([spec for spec, _ in chosen], line)
    for spec, install in chosen:
        if line is not None and not is_supported(spec, line):  # an always-on patch off its lines (else refused)
            logger.warning("hybridserve plugin: %s left out: vLLM %s is not a line it was proven on (%s)",
                           spec.name, line, ", ".join(spec.lines or ()))
            continue
        install()
    logger.debug("hybridserve plugin registered: %s", config)
