"""Join the plugin's timeline events (core/common/timeline_log.py, written by the plugin's hooks and the proxy) per request and break each P/D request down.

A request is keyed by the proxy's X-Request-Id (32 hex digits), which vLLM keeps inside its own request ids on
both roles ("cmpl-<id>-0-<suffix>"). A scheduler event's role comes from the `arrive` line of the same process
(prefill or decode); the worker's NIXL events are decode's. Each gap is the time between two events of the one
request; `gaps()` gives p50/p90 per gap over the requests that have both ends.
"""

from __future__ import annotations

import json
import re
import statistics
from collections import defaultdict
from pathlib import Path

_KEY = re.compile(r"[0-9a-f]{32}")

# (name, from event, to event): events are "<role>:<event>" (proxy, prefill, decode)
GAPS = (
    ("proxy hop 1 (prefill answer)", "proxy:hop1_start", "proxy:hop1_end"),
    ("prefill: arrive -> scheduled", "prefill:arrive", "prefill:scheduled"),
    ("prefill: scheduled -> token", "prefill:scheduled", "prefill:first_token"),
    ("prefill: token -> proxy has answer", "prefill:first_token", "proxy:hop1_end"),
    ("proxy: hop 1 end -> hop 2 start", "proxy:hop1_end", "proxy:hop2_start"),
    ("decode: hop 2 start -> arrive", "proxy:hop2_start", "decode:arrive"),
    ("decode: arrive -> alloc", "decode:arrive", "decode:alloc"),
    ("decode: alloc -> READ post start", "decode:alloc", "decode:post_start"),
    ("decode: READ post", "decode:post_start", "decode:posted"),
    ("decode: posted -> NIXL done (poll)", "decode:posted", "decode:nixl_done"),
    ("decode: NIXL done -> scheduler sees it", "decode:nixl_done", "decode:recv_seen"),
    ("decode: seen -> scheduled", "decode:recv_seen", "decode:scheduled"),
    ("decode: scheduled -> first token", "decode:scheduled", "decode:first_token"),
    ("decode: first token -> proxy first byte", "decode:first_token", "proxy:hop2_first_byte"),
    ("P/D total (hop 1 start -> first byte)", "proxy:hop1_start", "proxy:hop2_first_byte"),
    # the first token from prefill (core/proxy/first_token.py): what the client waits for, without decode's hop
    ("proxy: hop 1 start -> token 1 out", "proxy:hop1_start", "proxy:first_token_out"),
)
_WORKER_EVENTS = {"post_start", "posted", "nixl_done"}
_PROXY_EVENTS = {"hop1_start", "hop1_end", "hop2_start", "hop2_first_byte", "first_token_out", "retry", "fallback"}


def read_events(path: Path) -> list[dict]:
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue  # a line cut by a killed process
    return events


def per_request(events: list[dict]) -> dict[str, dict[str, float]]:
    """{X-Request-Id: {"<role>:<event>": first time}} for the requests the proxy saw."""
    roles = {e["pid"]: e.get("role") for e in events if e["event"] == "arrive"}
    out: dict[str, dict[str, float]] = defaultdict(dict)
    for e in sorted(events, key=lambda e: e["t"]):
        found = _KEY.search(e["req"])
        if found is None:
            continue
        if e["event"] in _PROXY_EVENTS:
            role = "proxy"
        elif e["event"] in _WORKER_EVENTS:
            role = "decode"
        else:
            role = roles.get(e["pid"]) or "unknown"
        out[found.group(0)].setdefault(f"{role}:{e['event']}", e["t"])
    return {key: times for key, times in out.items() if "proxy:hop1_start" in times}


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def gaps(requests: dict[str, dict[str, float]]) -> list[dict]:
    """One row per gap: name, count, p50_ms, p90_ms, mean_ms (rows with no request are left out)."""
    rows = []
    for name, start, end in GAPS:
        values = [(t[end] - t[start]) * 1e3 for t in requests.values() if start in t and end in t]
        if values:
            rows.append({"gap": name, "from": start, "to": end, "count": len(values),
                         "p50_ms": round(_quantile(values, 0.5), 3), "p90_ms": round(_quantile(values, 0.9), 3),
                         "mean_ms": round(statistics.fmean(values), 3)})
    return rows


def breakdown(path: Path, since: float | None = None, until: float | None = None) -> dict:
    """The gaps of the requests in the file whose hop 1 began within [since, until] (either bound optional)."""
    requests = per_request(read_events(path))
    lo, hi = since if since is not None else float("-inf"), until if until is not None else float("inf")
    requests = {k: t for k, t in requests.items() if lo <= t["proxy:hop1_start"] <= hi}
    return {"requests": len(requests), "gaps": gaps(requests)}
