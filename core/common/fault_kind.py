"""The faults a decode server can be armed with, named once for the CLI, validate, bench and the plugin.

Two families: the P/D race faults `validate --fault` arms (each corrupts a request's state: validate must catch
it), and latency faults (`slow_decode`: the state stays right, the server is slower: `bench` must show it).

The plugin (core/vllm_plugin/faults.py) reads `FAULT_ENV` (one fault for the server's life) or `FAULT_FILE_ENV` (a
file naming the fault armed now, read at every step: one running deployment serves a clean run and each fault in
turn) inside the server and patches vLLM; everything outside the server only needs the names, so they live here,
away from the patching code.
"""

from __future__ import annotations

import enum

from hybridserve.core.common.choices import parse_choice
from hybridserve.core.common.contracts import FAULT_ENV, FAULT_FILE_ENV



class FaultKind(enum.Enum):
    EARLY_COMPLETION = "early_completion"
    ZERO_AFTER_TRANSFER = "zero_after_transfer"
    STALE_STATE = "stale_state"
    SLOW_DECODE = "slow_decode"  # latency: the decode worker sleeps SLOW_DECODE_STEP_S in every engine step

    @property
    def is_state_corruption(self) -> bool:
        """A race that corrupts the transferred state (validate's faults); False for a latency fault."""
        return self is not FaultKind.SLOW_DECODE


# What validate's fault tests enumerate: every fault that must change the answers.
STATE_CORRUPTION_FAULTS = tuple(k for k in FaultKind if k.is_state_corruption)
LATENCY_FAULTS = tuple(k for k in FaultKind if not k.is_state_corruption)
# slow_decode's sleep per decode engine step (one step makes one token per running request): 50 ms is several
# times the tiny model's CPU inter-token latency (7-32 ms seen), so the bench's ITL p50 moves above it.
SLOW_DECODE_STEP_S = 0.05


def parse_fault(text: str | None) -> FaultKind | None:
    """A fault name from the command line; None or blank means no fault."""
    if text is None or not text.strip():
        return None
    return parse_choice(FaultKind, text, what="--fault")
