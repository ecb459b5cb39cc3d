"""What the engines that compute each prompt measured themselves, per phase: vLLM's request histograms on the
prefill servers (a P/D target's, as its proxy lists them) or on the plain server, scraped before and after the phase.

It separates a deployment's TTFT into the engine's own share and the rest (the proxy, the hops, the API server):
a P/D deployment and one server compare by the same clock on the same prompts. The names and intervals are vLLM's
(`vllm/v1/metrics/stats.py`, `update_from_finished_request` and `update_from_output`; read in 0.26 and 0.32):
- `vllm:request_queue_time_seconds`: first QUEUED to first SCHEDULED, in the engine core;
- `vllm:request_prefill_time_seconds`: first SCHEDULED to the first new token (the prefill steps, sampling included);
- `vllm:time_to_first_token_seconds`: the API server's arrival to its first token (tokenizing and the engine core's
  round trip included).
The buckets are coarse (0.3 s and up for the first two), so only means are kept.
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridserve.core.bench.server_metrics import Samples, histogram_mean

QUEUE_TIME = "vllm:request_queue_time_seconds"
PREFILL_TIME = "vllm:request_prefill_time_seconds"
SERVER_TTFT = "vllm:time_to_first_token_seconds"


@dataclass(frozen=True, kw_only=True)
class EngineTiming:
    """One phase on the prompt-computing engines, from the scraped differences (several engines summed)."""

    num_requests: int  # requests the engines finished in the phase (prefill time and queue time count these)
    mean_queue_s: float | None
    mean_prefill_s: float | None
    mean_server_ttft_s: float | None  # over the first tokens the API servers saw (a request counted at token 1)


def engine_timing(samples: Samples) -> EngineTiming | None:
    """None when the servers export no request histograms (not vLLM, or no /metrics)."""
    if (f"{PREFILL_TIME}_count", None) not in samples:
        return None
    return EngineTiming(num_requests=round(samples[(f"{PREFILL_TIME}_count", None)]),
                        mean_queue_s=histogram_mean(samples, QUEUE_TIME),
                        mean_prefill_s=histogram_mean(samples, PREFILL_TIME),
                        mean_server_ttft_s=histogram_mean(samples, SERVER_TTFT))
