"""Decode's NIXL stats from its Prometheus `/metrics`: scraped before and after a phase, the difference per phase.

The names are vLLM's NixlConnector metrics (nixl/stats.py `NixlPromMetrics`, the same names in 0.26 and 0.32):
histograms `vllm:nixl_xfer_time_seconds`, `vllm:nixl_post_time_seconds`, `vllm:nixl_bytes_transferred`,
`vllm:nixl_num_descriptors`, one observation per completed NIXL transfer handle (`_pop_done_transfers` records
`get_xfer_telemetry` of each DONE handle: xferDuration, postDuration, totalBytes, descCount, the count after NIXL's
merge); counters `vllm:nixl_num_failed_transfers` and `vllm:nixl_num_kv_expired_reqs` (prometheus_client writes
them with a `_total` suffix). Series of several engines or models are summed.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass

XFER_TIME = "vllm:nixl_xfer_time_seconds"
POST_TIME = "vllm:nixl_post_time_seconds"
BYTES = "vllm:nixl_bytes_transferred"
DESCRIPTORS = "vllm:nixl_num_descriptors"
FAILED = "vllm:nixl_num_failed_transfers_total"
EXPIRED = "vllm:nixl_num_kv_expired_reqs_total"

_SAMPLE = re.compile(r'^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)')
_LE = re.compile(r'le="([^"]+)"')

Samples = dict[tuple[str, float | None], float]  # (metric name, bucket bound or None) -> value summed over series


def parse_prometheus(text: str) -> Samples:
    """Prometheus text exposition -> summed samples; `le` is kept for histogram buckets, other labels dropped."""
    out: Samples = defaultdict(float)
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None or line.startswith("#"):
            continue
        name, labels, value = match.groups()
        le = _LE.search(labels or "") if name.endswith("_bucket") else None
        try:
            out[(name, float(le.group(1)) if le else None)] += float(value)
        except ValueError:
            continue
    return dict(out)


def delta(after: Samples, before: Samples) -> Samples:
    """What the phase added (a series missing before counts from 0)."""
    return {key: value - before.get(key, 0.0) for key, value in after.items()}


@dataclass(frozen=True, kw_only=True)
class NixlStats:
    """One phase's NIXL transfers on the decode side(s), from the scraped differences."""

    num_transfers: int
    mean_xfer_s: float | None
    p50_xfer_s: float | None  # estimated from the histogram buckets, as Prometheus' histogram_quantile does
    mean_post_s: float | None
    mean_bytes: float | None
    mean_descriptors: float | None
    num_failed_transfers: int
    num_kv_expired: int


def histogram_quantile(q: float, buckets: dict[float, float]) -> float | None:
    """Prometheus' rule: find the bucket holding rank q*count, interpolate linearly inside it (lower bound of the
    first bucket is 0; a rank in the +Inf bucket gives the largest finite bound)."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    rank, lower, below = q * buckets[bounds[-1]], 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                return lower
            inside = count - below
            return lower + (bound - lower) * ((rank - below) / inside if inside > 0 else 1.0)
        lower, below = bound, count
    return lower


def histogram_mean(samples: Samples, name: str) -> float | None:
    """A histogram's mean over the samples (sum / count); None where it counted nothing."""
    count = samples.get((f"{name}_count", None), 0.0)
    return samples.get((f"{name}_sum", None), 0.0) / count if count > 0 else None


def nixl_stats(samples: Samples) -> NixlStats | None:
    """None when the server exports no NIXL metrics (a server without the NixlConnector)."""
    if (f"{XFER_TIME}_count", None) not in samples:
        return None
    buckets = {le: v for (name, le), v in samples.items() if name == f"{XFER_TIME}_bucket" and le is not None}
    return NixlStats(
        num_transfers=round(samples[(f"{XFER_TIME}_count", None)]),
        mean_xfer_s=histogram_mean(samples, XFER_TIME), p50_xfer_s=histogram_quantile(0.5, buckets),
        mean_post_s=histogram_mean(samples, POST_TIME), mean_bytes=histogram_mean(samples, BYTES),
        mean_descriptors=histogram_mean(samples, DESCRIPTORS),
        num_failed_transfers=round(samples.get((FAILED, None), 0.0)),
        num_kv_expired=round(samples.get((EXPIRED, None), 0.0)))
