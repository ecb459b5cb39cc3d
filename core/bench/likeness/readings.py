"""Reading one bench target's engine settings (settings.py) from everything it leaves readable.

The engines of a target: for one hybridserve launched (a configuration bench starts, or a URL a live launch run
serves: launched.py), the plan's engines, each read from its log, its /metrics and its command line; for any other
URL, the servers the project's proxy lists in its /health (prefill and decode), else the URL itself, read from
/metrics. The front door's /v1/models gives max-model-len to both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hybridserve.core.bench.launched import LaunchedEngine
from hybridserve.core.bench.likeness.alike import TargetSettings
from hybridserve.core.bench.likeness.engine_settings import (
    EngineSettings, cache_config_labels, engine_gpus, from_cache_config, from_launch, from_log, from_model_card,
    with_gpus,
)
from hybridserve.core.bench.scrape import proxy_health


def launched_settings(client: Any, role: str, engines: tuple[LaunchedEngine, ...], *,
                      max_model_len: int | None = None, num_gpus: int | None = None) -> TargetSettings:
    """A target hybridserve launched: the log first (what vLLM resolved), then /metrics, then the flags. `client`
    None: not started yet, so its flags only. `num_gpus` (--gpus) wins over the plan's GPUs."""
    read = []
    for e in engines:
        settings = EngineSettings(name=e.name, readings=from_log(e.log_text()))
        if client is not None:
            settings = settings.merged(_metrics(client, e.url))
        read.append(with_gpus(settings.merged(from_launch(e.argv, e.env)), engine_gpus(e.env)))
    gpus = {g for e in engines for g in engine_gpus(e.env) or ()}
    return TargetSettings(role=role, engines=tuple(read), front=from_model_card(max_model_len),
                          num_gpus=num_gpus if num_gpus is not None else len(gpus) or None,
                          why_unread="vLLM shows it neither in its log nor in /metrics")


def url_settings(client: Any, role: str, url: str, *, max_model_len: int | None, num_gpus: int | None,
                 run_root: Path) -> TargetSettings:
    """A URL no live launch run under `run_root` serves: what its engines' /metrics show."""
    health = proxy_health(client, url)
    behind: list[tuple[str, str]] = []
    for kind in ("prefill", "decode", "replica"):  # the project's proxy lists its engines by role (replicas too)
        urls = health.get(kind)
        if isinstance(urls, list):
            behind += [(f"{kind}-{i}", str(u).rstrip("/")) for i, u in enumerate(urls)]
    engines = tuple(EngineSettings(name=name, readings=_metrics(client, u)) for name, u in behind or [(url, url)])
    why = (f"not in vLLM's /metrics, and no live `hybridserve launch` run under {run_root} serves {url} (its "
           "flags and logs would say)")
    return TargetSettings(role=role, engines=engines, front=from_model_card(max_model_len), num_gpus=num_gpus,
                          why_unread=why)


def _metrics(client: Any, url: str) -> dict:
    import httpx

    try:
        answer = client.get(f"{url}/metrics")
    except httpx.HTTPError:
        return {}
    labels = cache_config_labels(answer.text) if answer.status_code == 200 else None
    return from_cache_config(labels) if labels else {}
