"""The proxy's settings: where the prefill and decode servers (or the replicas) are, how to pick one, how long to
wait, the keys."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from hybridserve.core.launch.topology import FirstTokenSource, RoutingPolicy


@dataclass(frozen=True, kw_only=True)
class ProxyConfig:
    prefill_urls: tuple[str, ...] = ()
    decode_urls: tuple[str, ...] = ()
    replica_urls: tuple[str, ...] = ()  # aggregated serving: each request whole to one of them (no P/D hops)
    policy: RoutingPolicy = RoutingPolicy.ROUND_ROBIN
    timeout_s: float = 120.0  # per hop (connect, each read): a server that stalls fails the request, never hangs it
    model_name: str | None = None
    first_token: FirstTokenSource = FirstTokenSource.PREFILL  # who samples a plain completion's token 1
    # keys (core/launch/keys.py), kept out of repr so that no log of the config shows one
    api_key: str | None = field(default=None, repr=False)  # what clients must send; None: the door is open
    engine_key: str | None = field(default=None, repr=False)  # what the proxy sends the engines; None: nothing
    health_interval_s: float | None = None  # probe every server's /health this often (health_watch.py); None: never
    warm_file: Path | None = None  # launch's warm file (core/common/warm_state.py): servers it still warms stay down
