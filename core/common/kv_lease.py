"""Prefill's KV lease as the P/D path sees it: when prefill may free the blocks of a request no decode has read.

vLLM's NixlConnector (0.26 and 0.32, nixl/pull_scheduler.py `request_finished`) keeps a finished prefill's blocks
for `kv_lease_duration` seconds (30 by default) from the moment the request finished, then frees them
(`_reap_expired_send_leases`) and reuses them for other prompts. A decode that READs them later reads whatever is
there now and answers from it (issue 39: HTTP 200 with 1 token of 16). Heartbeats from the decode that holds the
request extend the lease (the worker's `_handle_heartbeat`: to now + lease * 2 // 3), but only while prefill still
holds the blocks.

The plugin on prefill stamps the lease's end into the kv_transfer_params prefill answers with (`STAMP_KEY`, Unix
seconds: `time.time()` when prefill's own deadline is set, plus the lease): prefill frees nothing before it (vLLM
0.32 rebases the deadline onto the worker's clock, which only lengthens it). Wall clocks of two hosts differ, so
every reader takes `margin_s` off it (`DEFAULT_MARGIN_S`, or HYBRIDSERVE_LEASE_MARGIN_S): the proxy drops the
parameters of a decode hop that would begin past it (the decode computes the prompt itself), and the plugin on
decode refuses a READ it could not finish before it (core/vllm_plugin/lease_guard.py).

A decode answer whose READ the plugin refused carries `{REFUSED_KEY: REFUSED}` in its kv_transfer_params (non-streamed
answers only: vLLM's streams carry no kv_transfer_params); the proxy counts it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

from hybridserve.core.common.contracts import LEASE_MARGIN_ENV as MARGIN_ENV  # the names of the wire contract
from hybridserve.core.common.contracts import (  # noqa: F401 (read by the plugin and the proxy through this module)
    LEASE_REFUSED as REFUSED, LEASE_REFUSED_KEY as REFUSED_KEY, LEASE_STAMP_KEY as STAMP_KEY,
)

# Clock skew between hosts plus a heartbeat's way to prefill; NTP keeps skew to milliseconds, one host has none.
DEFAULT_MARGIN_S = 1.0


def margin_from_env(env: Mapping[str, str] | None = None) -> float:
    """HYBRIDSERVE_LEASE_MARGIN_S when it is a number >= 0, else DEFAULT_MARGIN_S."""
    text = (os.environ if env is None else env).get(MARGIN_ENV, "").strip()
    try:
        value = float(text) if text else DEFAULT_MARGIN_S
    except ValueError:
        return DEFAULT_MARGIN_S
    return value if math.isfinite(value) and value >= 0 else DEFAULT_MARGIN_S


def lease_end(params: Mapping[str, object] | None) -> float | None:
    """The stamp of prefill's kv_transfer_params; None when there is none (a prefill without the plugin)."""
    value = (params or {}).get(STAMP_KEY)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def is_expired(params: Mapping[str, object] | None, now_unix: float, margin_s: float = DEFAULT_MARGIN_S) -> bool:
    """Whether prefill may have freed the blocks by `now_unix` (False when the parameters carry no stamp)."""
    end = lease_end(params)
    return end is not None and now_unix >= end - margin_s


def is_refused(answer: object) -> bool:
    """Whether a decode's JSON answer says the lease guard refused its READ (the prompt was computed again)."""
    params = answer.get("kv_transfer_params") if isinstance(answer, dict) else None
    return isinstance(params, dict) and params.get(REFUSED_KEY) == REFUSED
