"""A burst of requests at once through the front door of a P/D deployment whose KV lease is short, every answer
judged against prefill's own (reference.py), and what the lease went through, counted from the run's own records
(benchmarks/lease_burst.py; BENCHMARKS.md, "Prefill's KV lease").

From the timeline (core/chaos/timeline_gaps.py, keyed by X-Request-Id): how long each request waited in decode's queue
(decode `arrive` -> `alloc`) and how long prefill's blocks had to outlive the request's prefill (prefill's token ->
decode's NIXL READ seen done): a value above the lease is a READ the lease alone would not have covered. From the
logs: READs the guard refused (decode), leases prefill let expire and READs it saw after that (vLLM's own lines).
From the proxy's /metrics: its lease counters.
"""

from __future__ import annotations

import re
import statistics
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from hybridserve.core.chaos.bounded_load import Load, Sent
from hybridserve.core.chaos.tally import verdicts
from hybridserve.core.chaos.timeline_gaps import per_request, read_events
from hybridserve.core.common.contracts import REFUSED_LOG_PREFIX

EXPIRED_LOG = "Releasing expired KV blocks for request"  # vLLM's prefill (0.26 and 0.32 _reap_expired_send_leases)
LATE_READ_LOG = "Potentially invalid KV blocks for unrecognized request"  # vLLM's prefill (pull_worker _get_new_notifs)
_LEASE_METRIC = re.compile(r'^hybridserve_proxy_lease_total\{action="([a-z_]+)"\} ([0-9.]+)$', re.M)


@dataclass(frozen=True, kw_only=True)
class BurstResult:
    num_requests: int
    right: int
    wrong: int
    errors: int
    seconds: float  # the burst, first request sent to last answer
    decode_wait_s: dict[str, float | None]  # decode's queue: max, p50 over the requests (arrive -> alloc)
    lease_needed_s: dict[str, float | None]  # prefill's token -> decode's READ done: max, p50
    num_over_lease: int  # requests whose READ came later than the lease after prefill's token
    refused: int  # decode log: READs the guard refused
    expired: int  # prefill log: leases vLLM let run out
    late_reads: int  # prefill log: READs of blocks whose lease had run out
    proxy_lease: dict[str, float]  # the proxy's hybridserve_proxy_lease_total by action
    wrong_answers: list[dict] = field(default_factory=list)
    errors_told: list[str] = field(default_factory=list)


def send_burst(load: Load, num_requests: int) -> tuple[list[Sent], float]:
    """`num_requests` at once (every other one streamed), the pool's prompts in turn; (sent, seconds)."""
    with httpx.Client(timeout=load.timeout_s, limits=httpx.Limits(max_connections=num_requests)) as client:
        with ThreadPoolExecutor(max_workers=num_requests) as pool:
            sent = list(pool.map(lambda i: load.send(client, is_stream=i % 2 == 1,
                                                     prompt_index=i % len(load.prompts)), range(num_requests)))
    return sent, round(max(s.end for s in sent) - min(s.start for s in sent), 2)


def _stats(values: list[float]) -> dict[str, float | None]:
    return {"max": round(max(values), 2) if values else None,
            "p50": round(statistics.median(values), 2) if values else None, "count": len(values)}


def _count(path: Path, text: str) -> int:
    return path.read_text(errors="replace").count(text) if path.is_file() else 0


def count_refused(run_dir: Path) -> int:
    """READs the guard refused, from decode's log."""
    return _count(run_dir / "decode-0.log", REFUSED_LOG_PREFIX)


def proxy_lease(url: str) -> dict[str, float]:
    try:
        return {k: float(v) for k, v in _LEASE_METRIC.findall(httpx.get(f"{url}/metrics", timeout=10).text)}
    except httpx.HTTPError:
        return {}


def tally_burst(sent: list[Sent], seconds: float, references: list, thresholds, *, timeline: Path, run_dir: Path,
                proxy_url: str, lease_s: float) -> BurstResult:
    judged = verdicts(sent, references, thresholds)
    mine = {s.rid for s in sent}
    times = {k: t for k, t in per_request(read_events(timeline)).items() if k in mine} if timeline.is_file() else {}
    waits = [t["decode:alloc"] - t["decode:arrive"] for t in times.values()
             if {"decode:alloc", "decode:arrive"} <= set(t)]
    needed = [t["decode:nixl_done"] - t["prefill:first_token"] for t in times.values()
              if {"decode:nixl_done", "prefill:first_token"} <= set(t)]
    return BurstResult(
        num_requests=len(sent), right=sum(judged.get(s.rid, "x") is None for s in sent),
        wrong=sum(judged.get(s.rid) is not None for s in sent), errors=sum(not s.is_ok for s in sent),
        seconds=seconds, decode_wait_s=_stats(waits), lease_needed_s=_stats(needed),
        num_over_lease=sum(n > lease_s for n in needed),
        refused=count_refused(run_dir),
        expired=_count(run_dir / "prefill-0.log", EXPIRED_LOG),
        late_reads=_count(run_dir / "prefill-0.log", LATE_READ_LOG),
        proxy_lease=proxy_lease(proxy_url),
        wrong_answers=[{"rid": s.rid, "prompt_index": s.prompt_index, "why": judged[s.rid]} for s in sent
                       if judged.get(s.rid)],
        errors_told=[s.error or "" for s in sent if not s.is_ok])
