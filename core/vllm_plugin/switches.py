"""The plugin's switches: environment variables that `hybridserve launch` sets per role.

vLLM loads every installed general plugin in every vLLM process of the environment, so each fix is off unless
its variable is set; only the torchvision import shim and the one-line scheduler log are always on (both are
harmless). Values are parsed here, once.
"""

from __future__ import annotations

from hybridserve.core.common.contracts import NIXL_PROGRESS_DELAY_US, CPU_CORES, KEEP_ASYNC_SCHEDULING, GDN_DISPATCH_PROFILE, GDN_DISPATCH_LOG_CALLS, RELEASE_DEAD_PEERS, PIN_PEER_REGIONS, LEASE_GUARD, PLUGIN_DISABLE as DISABLE

import os
from dataclasses import dataclass



@dataclass(frozen=True, kw_only=True)
class PluginSettings:
    is_disabled: bool = False
    nixl_progress_delay_us: int | None = None  # None: leave NIXL's progress thread as it is (delay 0, spins)
    cpu_cores: tuple[int, ...] | None = None  # None: let NixlConnector move the compute thread (stock)
    keep_async_scheduling: bool = False
    gdn_dispatch_profile: str | None = None  # None: vLLM's own GDN prefill call, untouched
    is_gdn_dispatch_log_calls: bool = False
    is_release_dead_peers: bool = False  # peer_release.py
    is_pin_peer_regions: bool = False  # peer_pin.py
    is_lease_guard: bool = False  # lease_stamp.py, lease_guard.py


def parse_cores(text: str) -> tuple[int, ...]:
    """'0', '0-3', '0,2,4-5' (the VLLM_CPU_OMP_THREADS_BIND syntax for one rank) -> sorted core ids."""
    cores: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        first, last = int(lo), int(hi or lo)
        if first < 0 or last < first:
            raise ValueError(f"bad core range {part!r}")
        cores.update(range(first, last + 1))
    if not cores:
        raise ValueError(f"no cores in {text!r}")
    return tuple(sorted(cores))


def format_cores(cores: tuple[int, ...]) -> str:
    return ",".join(str(c) for c in cores)


def from_env(env: dict[str, str] | None = None) -> PluginSettings:
    env = dict(os.environ) if env is None else env
    delay = env.get(NIXL_PROGRESS_DELAY_US, "").strip()
    cores = env.get(CPU_CORES, "").strip()
    return PluginSettings(
        is_disabled=env.get(DISABLE) == "1",
        nixl_progress_delay_us=int(delay) if delay else None,
        cpu_cores=parse_cores(cores) if cores else None,
        keep_async_scheduling=env.get(KEEP_ASYNC_SCHEDULING) == "1",
        gdn_dispatch_profile=env.get(GDN_DISPATCH_PROFILE, "").strip() or None,
        is_gdn_dispatch_log_calls=env.get(GDN_DISPATCH_LOG_CALLS) == "1",
        is_release_dead_peers=env.get(RELEASE_DEAD_PEERS) == "1",
        is_pin_peer_regions=env.get(PIN_PEER_REGIONS) == "1",
        is_lease_guard=env.get(LEASE_GUARD) == "1",
    )
