"""The P/D race faults `validate --fault` can arm in a decode server, named once for the CLI, validate and the plugin.

The plugin (core/vllm_plugin/faults.py) reads `FAULT_ENV` (one fault for the server's life) or `FAULT_FILE_ENV` (a
file naming the fault armed now, read at every step: one running deployment serves a clean run and each fault in
turn) inside the server and patches vLLM; everything outside the server only needs the names, so they live here,
away from the patching code.
"""

from __future__ import annotations

import enum

from hybridserve.core.common.choices import parse_choice

FAULT_ENV = "HYBRIDSERVE_FAULT"
FAULT_FILE_ENV = "HYBRIDSERVE_FAULT_FILE"


class FaultKind(enum.Enum):
    EARLY_COMPLETION = "early_completion"
    ZERO_AFTER_TRANSFER = "zero_after_transfer"
    STALE_STATE = "stale_state"


def parse_fault(text: str | None) -> FaultKind | None:
    """A fault name from the command line; None or blank means no fault."""
    if text is None or not text.strip():
        return None
    return parse_choice(FaultKind, text, what="--fault")
