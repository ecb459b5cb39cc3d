"""Find model and hardware profiles: a profile name, a config.json path, or a model folder."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from hybridserve import profiles as _profiles_pkg
from hybridserve.core.common.errors import InputError
from hybridserve.core.model.model_config import spec_from_config
from hybridserve.core.model.spec import ModelSpec

PROFILES_DIR = Path(_profiles_pkg.__file__).parent
MODELS_DIR = PROFILES_DIR / "models"


def model_profile_names() -> list[str]:
    return sorted(p.stem for p in MODELS_DIR.glob("*.json"))


def load_model(ref: str) -> ModelSpec:
    """`ref` is a profile name (see `model_profile_names`), a config.json, or a folder holding one."""
    path = Path(ref).expanduser()
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise InputError(f"--model {ref}: folder has no config.json; accepted: a profile name, "
                             f"a config.json path or a model folder")
        name = path.parent.name
    elif path.is_file():
        name = path.parent.name if path.name == "config.json" else path.stem
    elif (MODELS_DIR / f"{ref.lower()}.json").is_file():
        path, name = MODELS_DIR / f"{ref.lower()}.json", ref.lower()
    else:
        raise InputError(f"--model {ref}: no such profile, file or folder; profiles: "
                         f"{', '.join(model_profile_names())}")
    try:
        config = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"--model {ref}: {path} is not valid JSON ({exc}); accepted: a HF config.json") from None
    source = config.get("_source") if isinstance(config, dict) else None
    return spec_from_config(config, name=name, source=source or str(path))


@dataclass(frozen=True, kw_only=True)
class HardwareProfile:
    key: str
    name: str
    memory_bytes: int
    source: str


def hardware_profiles() -> dict[str, HardwareProfile]:
    raw = yaml.safe_load((PROFILES_DIR / "hardware.yaml").read_text())
    return {
        key: HardwareProfile(key=key, name=v["name"], source=v["source"],
                             memory_bytes=int(v["memory_gib"] * 2**30) if "memory_gib" in v else int(v["memory_gb"] * 10**9))
        for key, v in raw.items()
    }


def device_memory_bytes(text: str, *, what: str = "--memory") -> int:
    """'h200', 'H200' or a number of GiB ('80', '79.5')."""
    profiles = hardware_profiles()
    if text.lower() in profiles:
        return profiles[text.lower()].memory_bytes
    try:
        gib = float(text)
    except ValueError:
        gib = -1.0
    if gib <= 0:
        raise InputError(f"{what} {text}: accepted: a positive number of GiB or one of {', '.join(profiles)}")
    return int(gib * 2**30)
