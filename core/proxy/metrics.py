"""Counters the proxy serves at /metrics in Prometheus text format."""

from __future__ import annotations

from collections import Counter


class ProxyMetrics:
    def __init__(self) -> None:
        self.requests: Counter[str] = Counter()  # by outcome: ok, prefill_error, decode_error,
        # client_error (a role refused the request with a 4xx), cancelled (the client left a stream), bad_request
        self.hop_seconds: Counter[str] = Counter()  # summed seconds per hop (prefill, decode)
        self.hop_count: Counter[str] = Counter()
        self.retries: Counter[str] = Counter()  # by role: a hop tried again on another server of it (failover.py)
        self.fallbacks: Counter[str] = Counter()  # by the role that served a request alone

    def observe_hop(self, hop: str, seconds: float) -> None:
        self.hop_seconds[hop] += seconds
        self.hop_count[hop] += 1

    def render(self, outstanding: dict[str, dict[str, int]], up: dict[str, dict[str, bool]] | None = None) -> str:
        lines = ["# TYPE hybridserve_proxy_requests_total counter"]
        lines += [f'hybridserve_proxy_requests_total{{outcome="{k}"}} {v}' for k, v in sorted(self.requests.items())]
        lines.append("# TYPE hybridserve_proxy_retries_total counter")
        lines += [f'hybridserve_proxy_retries_total{{role="{k}"}} {v}' for k, v in sorted(self.retries.items())]
        lines.append("# TYPE hybridserve_proxy_fallbacks_total counter")
        lines += [f'hybridserve_proxy_fallbacks_total{{served_by="{k}"}} {v}' for k, v in sorted(self.fallbacks.items())]
        lines.append("# TYPE hybridserve_proxy_server_up gauge")
        for role, per_url in sorted((up or {}).items()):
            lines += [f'hybridserve_proxy_server_up{{role="{role}",url="{u}"}} {int(ok)}' for u, ok in per_url.items()]
        lines.append("# TYPE hybridserve_proxy_hop_seconds summary")
        for hop in sorted(self.hop_count):
            lines.append(f'hybridserve_proxy_hop_seconds_sum{{hop="{hop}"}} {self.hop_seconds[hop]:.6f}')
            lines.append(f'hybridserve_proxy_hop_seconds_count{{hop="{hop}"}} {self.hop_count[hop]}')
        lines.append("# TYPE hybridserve_proxy_outstanding gauge")
        for role, per_url in sorted(outstanding.items()):
            lines += [f'hybridserve_proxy_outstanding{{role="{role}",url="{u}"}} {n}' for u, n in per_url.items()]
        return "\n".join(lines) + "\n"
