"""Counters the proxy serves at /metrics in Prometheus text format."""

from __future__ import annotations

import re
from collections import Counter

from hybridserve.core.proxy.eligibility import Route

MAX_UNKNOWN_FIELD_NAMES = 32  # distinct names kept as labels; a client could otherwise grow /metrics without end
_LABEL_SAFE = re.compile(r"[A-Za-z0-9_.-]{1,64}")


class ProxyMetrics:
    def __init__(self) -> None:
        self.requests: Counter[str] = Counter()  # by outcome: ok, prefill_error, decode_error,
        # client_error (a role refused the request with a 4xx), cancelled (the client left a stream), bad_request,
        # unauthorized (no or a wrong front key: auth.py)
        self.hop_seconds: Counter[str] = Counter()  # summed seconds per hop (prefill, decode)
        self.hop_count: Counter[str] = Counter()
        self.first_token: Counter[tuple[str, str]] = Counter()  # by (route, reason): ("prefill", ""), or
        # ("two_hop", why not: eligibility.Route.reason)
        self.unknown_fields: Counter[str] = Counter()  # names of the fields that sent a request two hops
        self.retries: Counter[str] = Counter()  # by role: a hop tried again on another server of it (failover.py)
        self.fallbacks: Counter[str] = Counter()  # by the role that served a request alone
        # prefill's KV lease (core/common/kv_lease.py), by what was done: dropped (the decode hop went without the
        # parameters, past the lease), refused (decode's lease guard refused its READ and computed the prompt: seen
        # in non-streamed answers only; decode's vllm:nixl_num_kv_expired_reqs counts every one)
        self.lease: Counter[str] = Counter()

    def observe_route(self, route: Route) -> None:
        """A request the first-token path could have taken (launch --first-token prefill) and where it went."""
        self.first_token[("prefill", "") if route.is_first_token else ("two_hop", route.reason or "")] += 1
        for name in route.unknown_fields:
            if not _LABEL_SAFE.fullmatch(name):
                name = "_unprintable"
            elif name not in self.unknown_fields and len(self.unknown_fields) >= MAX_UNKNOWN_FIELD_NAMES:
                name = "_other"
            self.unknown_fields[name] += 1

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
        lines.append("# TYPE hybridserve_proxy_lease_total counter")
        lines += [f'hybridserve_proxy_lease_total{{action="{k}"}} {v}' for k, v in sorted(self.lease.items())]
        lines.append("# TYPE hybridserve_proxy_server_up gauge")
        for role, per_url in sorted((up or {}).items()):
            lines += [f'hybridserve_proxy_server_up{{role="{role}",url="{u}"}} {int(ok)}' for u, ok in per_url.items()]
        lines.append("# TYPE hybridserve_proxy_hop_seconds summary")
        for hop in sorted(self.hop_count):
            lines.append(f'hybridserve_proxy_hop_seconds_sum{{hop="{hop}"}} {self.hop_seconds[hop]:.6f}')
            lines.append(f'hybridserve_proxy_hop_seconds_count{{hop="{hop}"}} {self.hop_count[hop]}')
        lines.append("# TYPE hybridserve_proxy_first_token_total counter")
        for (route, reason), n in sorted(self.first_token.items()):
            label = f'route="{route}"' + (f',reason="{reason}"' if reason else "")
            lines.append(f"hybridserve_proxy_first_token_total{{{label}}} {n}")
        lines.append("# TYPE hybridserve_proxy_unknown_field_total counter")
        lines += [f'hybridserve_proxy_unknown_field_total{{field="{k}"}} {v}'
                  for k, v in sorted(self.unknown_fields.items())]
        lines.append("# TYPE hybridserve_proxy_outstanding gauge")
        for role, per_url in sorted(outstanding.items()):
            lines += [f'hybridserve_proxy_outstanding{{role="{role}",url="{u}"}} {n}' for u, n in per_url.items()]
        return "\n".join(lines) + "\n"
