"""A step-time profile: how long one vLLM engine step takes on a given GPU (or GPU share, or CPU core), as `plan`'s
sizing simulation charges it, and what one P/D transfer costs there. Measured by `hybridserve step-profile`
(core/sizing/measure.py) against a server of the target machine; shipped ones live in profiles/steps/.

One engine step runs a batch of requests, request i computing n_i new tokens after c_i tokens already in its KV
cache (a prefill chunk: n_i up to the token budget; a decode step: n_i = 1). The profile charges

    step_s = base_s + token_s * sum(n_i) + seq_s * len(batch) + attention_s * sum(n_i * c_i + n_i * (n_i + 1) / 2)

base_s: the step's fixed cost (the scheduler, the launch of every layer's kernels, sampling); token_s: the
per-token work (projections, MLP, the GDN chunk scan); seq_s: per request in the batch (its GDN conv and SSM state
read and written once a step, its metadata); attention_s: per query-key pair of the full-attention layers. A
client sees a first token `http_s` after the step that made it (the API server, the proxy's hop).

Transfer (P/D): the decode side's NIXL READ of one request, `post_s + descriptors * descriptor_s + bytes /
bytes_per_s`, with the descriptors and bytes from core/layout (vLLM's scheme after NIXL's merge) for the request's
length.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hybridserve import profiles as _profiles_pkg
from hybridserve.core.common import atomic_file
from hybridserve.core.common.errors import InputError

SCHEMA = "hybridserve.step-profile/1"
STEPS_DIR = Path(_profiles_pkg.__file__).parent / "steps"


@dataclass(frozen=True, kw_only=True)
class StepCoefficients:
    base_s: float
    token_s: float
    seq_s: float
    attention_s: float
    http_s: float = 0.0  # added once to a first token: the API server's and the proxy's share of TTFT

    def step_s(self, *, num_tokens: int, num_seqs: int, attention_pairs: float) -> float:
        return self.base_s + self.token_s * num_tokens + self.seq_s * num_seqs + self.attention_s * attention_pairs


@dataclass(frozen=True, kw_only=True)
class TransferCost:
    post_s: float = 0.0  # from the decode step that asks to the READ posted
    descriptor_s: float = 0.0  # per posted descriptor
    bytes_per_s: float = 1e12

    def transfer_s(self, *, descriptors: float, num_bytes: float) -> float:
        return self.post_s + self.descriptor_s * descriptors + num_bytes / self.bytes_per_s


@dataclass(frozen=True, kw_only=True)
class EngineLimits:
    """The scheduler limits of the measured engines (vLLM's --max-num-seqs, --max-num-batched-tokens)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int


@dataclass(frozen=True, kw_only=True)
class StepProfile:
    name: str
    unit: str  # what one engine had: "one CPU core", "H200, 50 % of the SMs (MPS), 0.45 of its memory"
    device: str  # cpu or cuda
    model: str  # the name of the model the steps were measured with (its folder name)
    tp: int
    coefficients: StepCoefficients
    transfer: TransferCost
    limits: EngineLimits
    num_blocks: int  # KV cache blocks of one engine (vLLM's num_gpu_blocks; CPU: from VLLM_CPU_KVCACHE_SPACE)
    # steps under sustained load over the idle fit, per deployment kind ("replicas", "pd"), from a closed-loop phase
    # through each kind's proxy (calibrate.py): the host's share of the machine (its API servers, the proxy, the
    # client on the same cores) and anything else idle requests do not show; absent: 1
    load_factors: dict[str, float] = field(default_factory=dict)
    measured: dict[str, Any] = field(default_factory=dict)  # date, command, versions, fit residuals, ranges

    @property
    def measured_prompt_tokens(self) -> tuple[int, int] | None:
        """The prompt lengths the fit saw (min, max); a workload outside them is a prediction beyond it."""
        span = self.measured.get("prompt_tokens")
        return (int(span[0]), int(span[1])) if span else None

    @property
    def measured_batch(self) -> int | None:
        """The largest decode batch the fit saw."""
        value = self.measured.get("max_batch")
        return int(value) if value else None


def shipped_profile_names() -> list[str]:
    return sorted(p.stem for p in STEPS_DIR.glob("*.yaml"))


def load_step_profile(ref: str | Path) -> StepProfile:
    """A shipped profile's name (profiles/steps/NAME.yaml) or a path to one."""
    path = Path(ref).expanduser()
    if not path.is_file():
        path = STEPS_DIR / f"{str(ref).lower()}.yaml"
    if not path.is_file():
        raise InputError(f"--gpus {ref}: no such step profile; accepted: a file written by hybridserve step-profile, "
                         f"or a shipped one: {', '.join(shipped_profile_names()) or '(none)'}")
    try:
        raw = yaml.safe_load(path.read_text())
        if raw.get("schema") != SCHEMA:
            raise ValueError(f"schema {raw.get('schema')!r}")
        return StepProfile(
            name=str(raw.get("name") or path.stem), unit=str(raw["unit"]), device=str(raw["device"]),
            model=str(raw["model"]), tp=int(raw.get("tp", 1)),
            coefficients=StepCoefficients(**raw["coefficients"]), transfer=TransferCost(**raw.get("transfer") or {}),
            limits=EngineLimits(**raw["limits"]), num_blocks=int(raw["num_blocks"]),
            load_factors={str(k): float(v) for k, v in (raw.get("load_factors") or {}).items()},
            measured=dict(raw.get("measured") or {}))
    except (OSError, yaml.YAMLError, AttributeError, KeyError, TypeError, ValueError) as exc:
        raise InputError(f"step profile {path}: not a {SCHEMA} file ({type(exc).__name__}: {exc}); accepted: a file "
                         "written by hybridserve step-profile") from None


def profile_dict(profile: StepProfile) -> dict[str, Any]:
    return {"schema": SCHEMA, "name": profile.name, "unit": profile.unit, "device": profile.device,
            "model": profile.model, "tp": profile.tp, "coefficients": asdict(profile.coefficients),
            "transfer": asdict(profile.transfer), "limits": asdict(profile.limits), "num_blocks": profile.num_blocks,
            "load_factors": profile.load_factors, "measured": profile.measured}


def write_step_profile(profile: StepProfile, path: Path) -> None:
    atomic_file.write_text(path, yaml.safe_dump(profile_dict(profile), sort_keys=False))
