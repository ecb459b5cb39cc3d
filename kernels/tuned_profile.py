"""The tuned profile: per (TP heads, batch shape) the fastest verified backend setting, as YAML."""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hybridserve.core.common.atomic_file import write_text
from hybridserve.core.common.choices import parse_choice
from hybridserve.core.common.errors import InputError
from hybridserve.kernels.backend import KnobSetting, knob_label

SCHEMA = "hybridserve.tuned-gdn-prefill/1"


class RankBy(enum.Enum):
    """What picks a bucket's winner: GPU time (the host runs ahead, as in a model's forward pass) or host-inclusive
    latency (host enqueue and GPU work in series: what a call costs when the host cannot run ahead)."""

    GPU = "gpu"
    HOST = "host"

    @classmethod
    def parse(cls, text: str) -> RankBy:
        return parse_choice(cls, text, what="--rank-by")


@dataclass(frozen=True, kw_only=True)
class Choice:
    backend: str
    knobs: KnobSetting = ()

    @property
    def label(self) -> str:
        return f"{self.backend}[{knob_label(self.knobs)}]"


@dataclass(frozen=True, kw_only=True)
class TunedEntry:
    tp: int
    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    num_seqs: int
    seq_len: int
    winner: Choice
    winner_ms: float  # the winner's time in the confirmation pass
    best_ms: float  # the fastest setting in the confirmation pass (winner_ms / best_ms - 1 = dispatch's loss)
    fla_ms: float | None
    flashinfer_auto_ms: float | None
    times_ms: dict[str, float]  # every verified setting, confirmation pass
    first_pass_ms: dict[str, float] = field(default_factory=dict)  # the pass that picked the winner (rank metric)
    host_ms: dict[str, float] = field(default_factory=dict)  # host time to enqueue one call (confirmation pass)
    latency_ms: dict[str, float] = field(default_factory=dict)  # host-inclusive latency of one call (confirmation)
    first_call_ms: dict[str, float] = field(default_factory=dict)  # wall time of the first call (compile included)
    rejected: dict[str, str] = field(default_factory=dict)  # setting -> why (wrong result, raised)
    ranked: tuple[Choice, ...] = ()  # verified settings, fastest first (dispatch falls back along it)


@dataclass(frozen=True, kw_only=True)
class TunedProfile:
    gpu: str
    device: str
    model: str
    dtype: str
    created_utc: str
    versions: dict[str, str]
    vllm_gdn_prefill_backend: str | None  # the single vLLM setting closest to the tuned result
    vllm_setting_geomean_ms: dict[str, float]
    timing: dict[str, Any]
    entries: tuple[TunedEntry, ...]
    rank_by: str = RankBy.GPU.value  # what picked each winner (profiles before issue 13: GPU-side timing)

    def ranked_times(self, entry: TunedEntry) -> dict[str, float]:
        """The confirmation-pass times in the metric that ranked the settings."""
        return entry.times_ms if self.rank_by == RankBy.GPU.value else entry.latency_ms


def _choice_dict(c: Choice) -> dict:
    return {"backend": c.backend, "knobs": dict(c.knobs)}


def to_dict(profile: TunedProfile) -> dict:
    data = asdict(profile)
    data["entries"] = []
    for e in profile.entries:
        row = asdict(e)
        row["winner"] = _choice_dict(e.winner)
        row["ranked"] = [_choice_dict(c) for c in e.ranked]
        data["entries"].append(row)
    return {"schema": SCHEMA, **data}


def write_profile(profile: TunedProfile, path: Path) -> None:
    """Written to a temporary file beside `path`, then renamed: never half-written."""
    write_text(path, yaml.safe_dump(to_dict(profile), sort_keys=False, width=120))


def _choice(raw: dict) -> Choice:
    return Choice(backend=str(raw["backend"]), knobs=tuple((raw.get("knobs") or {}).items()))


def read_profile(path: Path) -> TunedProfile:
    try:
        data = yaml.safe_load(Path(path).read_text())
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise ValueError(f"schema is not {SCHEMA}")
        entries = tuple(
            TunedEntry(**{**e, "winner": _choice(e["winner"]), "ranked": tuple(_choice(c) for c in e["ranked"])})
            for e in data["entries"])
        fields = {k: v for k, v in data.items() if k not in ("schema", "entries")}
        return TunedProfile(**fields, entries=entries)
    except (OSError, yaml.YAMLError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"--profile {path}: not a tuned GDN prefill profile ({exc}); accepted: a YAML file "
                         f"written by `hybridserve tune`") from None
