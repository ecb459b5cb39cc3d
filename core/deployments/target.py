"""What bench, validate, chaos and sizing talk to: a URL that is already serving, or a named configuration that
they start through launch's plan (core/deployments/deployed.py).

Named configurations:
- `single-sync` (validate's default baseline): one plain vLLM server, sync scheduling.
- `single-async`: the same server with async scheduling.
- `pd-async` (validate's default candidate): prefill + decode over NixlConnector + the project's proxy, async
  scheduling.
- `pd-sync`: the same P/D deployment with sync scheduling.
A fault (core/vllm_plugin/faults.py) may be armed in the decode server of a P/D configuration.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path

from hybridserve import profiles as _profiles_pkg
from hybridserve.core.common.errors import InputError
from hybridserve.core.common.fault_kind import FaultKind
from hybridserve.core.launch.topology import TINY_MODEL_DIR

RECALL_MODEL_DIR = Path(_profiles_pkg.__file__).parent / "tiny-qwen3.5-recall"


class Config(enum.Enum):
    SINGLE_SYNC = "single-sync"
    SINGLE_ASYNC = "single-async"
    PD_ASYNC = "pd-async"
    PD_SYNC = "pd-sync"

    @property
    def is_pd(self) -> bool:
        return self in (Config.PD_ASYNC, Config.PD_SYNC)

    @property
    def is_async(self) -> bool:
        return self in (Config.PD_ASYNC, Config.SINGLE_ASYNC)


@dataclass(frozen=True, kw_only=True)
class Target:
    """What to validate: `url` when something already serves it, else a configuration to start."""

    label: str
    url: str | None = None
    config: Config | None = None
    fault: FaultKind | None = None  # armed in the decode server (P/D configurations only)


def parse_target(text: str, *, what: str, fault: FaultKind | None = None) -> Target:
    text = text.strip()
    if text.startswith(("http://", "https://")):
        if fault is not None:
            raise InputError(f"--{what} {text}: a fault can only be armed in a configuration validate starts")
        return Target(label=text, url=text.rstrip("/"))
    for config in Config:
        if config.value == text.lower():
            if fault is not None and not config.is_pd:
                raise InputError(f"--{what} {text}: faults need a P/D configuration (pd-async or pd-sync)")
            label = config.value if fault is None else f"{config.value} + fault {fault.value}"
            return Target(label=label, config=config, fault=fault)
    names = ", ".join(c.value for c in Config)
    raise InputError(f"--{what} {text!r}: accepted: an http(s):// URL or one of {names}")


def default_model() -> Path:
    """The trained recall model when it is there, else launch's tiny model."""
    return RECALL_MODEL_DIR if (RECALL_MODEL_DIR / "config.json").is_file() else TINY_MODEL_DIR


# Launch's random-weight model has a byte-level BPE tokenizer (about 5 tokens per synthetic word): 100-160 words are
# 500-800 tokens, more than two 256-token blocks and inside its 2048-token context (520-760 words would not fit).
RANDOM_MODEL_SYNTHETIC = "synthetic:100-160"


def is_random_model(model: Path | None) -> bool:
    """Whether `model` (None: the default) is launch's tiny model with random weights rather than the trained one."""
    return (model or default_model()).resolve() == TINY_MODEL_DIR.resolve()
