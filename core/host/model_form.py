"""The form of a model folder a vLLM version loads: vLLM 0.26 needs a text-only Qwen3.5 wrapped as the multimodal one.

vLLM 0.26 registers Qwen3.5 only as `Qwen3_5ForConditionalGeneration`, which asks for a `Qwen3_5Config`
(`model_type: qwen3_5`, the text settings under `text_config`) and maps checkpoint names
`model.language_model.*` to its language model (`Qwen3VLForConditionalGeneration.hf_to_vllm_mapper`). The
shipped tiny models are text-only (`qwen3_5_text`, `Qwen3_5ForCausalLM`, names `model.*`), which 0.26 refuses
("Expected Qwen3_5Config, found Qwen3_5TextConfig"). The wrapped folder holds the same tensors, bytes unchanged:
only the config nests and the safetensors header renames `model.` to `model.language_model.`; served with
`--language-model-only`, 0.26 builds no vision tower and needs no vision weights. Pure Python: no torch.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import tempfile
from pathlib import Path

from hybridserve.core.common.errors import InputError

TEXT_MODEL_TYPE = "qwen3_5_text"
WRAPPED_ARCHITECTURE = "Qwen3_5ForConditionalGeneration"
_TEXT_PREFIX, _WRAPPED_PREFIX = "model.", "model.language_model."
_CONFIG_ONLY_KEYS = ("architectures", "transformers_version", "auto_map")
# vLLM's DefaultModelLoader._prepare_weights: the safetensors, then the PyTorch patterns it tries
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt")


def needs_wrapper(model_dir: Path) -> bool:
    """Whether the folder is a text-only Qwen3.5 (what vLLM 0.26 cannot load as it is)."""
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return config.get("model_type") == TEXT_MODEL_TYPE


def has_weights(model_dir: Path) -> bool:
    """Whether the folder holds weight files (vLLM's DefaultModelLoader looks for these patterns)."""
    return any(next(model_dir.glob(pattern), None) is not None for pattern in WEIGHT_PATTERNS)


def wrapped_dir(model_dir: Path, cache_root: Path | None = None) -> Path:
    """Where the wrapped form lives: keyed by the source's config and weights, so it is never stale."""
    digest = hashlib.sha256()
    for name in ("config.json", "model.safetensors"):
        path = model_dir / name
        stat = path.stat() if path.exists() else None
        digest.update(f"{name}:{stat.st_size if stat else 0}:{stat.st_mtime_ns if stat else 0}".encode())
    digest.update((model_dir / "config.json").read_bytes() if (model_dir / "config.json").exists() else b"")
    root = cache_root or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "hybridserve" / "models"
    return root / f"{model_dir.name}-qwen3_5-wrapped-{digest.hexdigest()[:12]}"


def wrapped_config(text_config: dict) -> dict:
    text = {k: v for k, v in text_config.items() if k not in _CONFIG_ONLY_KEYS}
    return {"architectures": [WRAPPED_ARCHITECTURE], "model_type": "qwen3_5", "text_config": text,
            "tie_word_embeddings": bool(text_config.get("tie_word_embeddings", False)),
            "dtype": text_config.get("dtype", text_config.get("torch_dtype", "bfloat16"))}


def renamed_safetensors(data: bytes, old: str = _TEXT_PREFIX, new: str = _WRAPPED_PREFIX) -> bytes:
    """The same file with tensor names `old*` renamed `new*` (header only; tensor bytes untouched).

    safetensors: 8-byte little-endian header length, a JSON header {name: {dtype, shape, data_offsets}},
    then the tensor bytes, whose offsets are relative to the end of the header (so a longer header is fine).
    """
    if len(data) < 8:
        raise InputError("model.safetensors: accepted: a safetensors file (it is shorter than its header)")
    size = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + size])
    renamed = {_renamed(k, old, new): v for k, v in header.items()}
    blob = json.dumps(renamed, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # keep the tensor data 8-byte aligned
    return struct.pack("<Q", len(blob)) + blob + data[8 + size:]


def _renamed(name: str, old: str = _TEXT_PREFIX, new: str = _WRAPPED_PREFIX) -> str:
    return new + name[len(old):] if name.startswith(old) and not name.startswith(new) else name


def ensure_wrapped(model_dir: Path, target: Path) -> Path:
    """Write the wrapped form of `model_dir` at `target` unless it is there; complete or absent, never half."""
    if (target / "config.json").is_file():
        return target
    # No weights (config and tokenizer only) is a folder served with `--load-format dummy`: vLLM's DummyModelLoader
    # reads no file, so the wrapped form is its config and the rest of the folder
    weights = sorted(model_dir.glob("*.safetensors"))
    if not weights and has_weights(model_dir):
        raise InputError(f"--model {model_dir}: accepted for vLLM 0.26's wrapped form: *.safetensors weights, or "
                         f"none (--load-format dummy); this folder has weights in another format")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        for path in model_dir.iterdir():
            if path.name.endswith(".safetensors.index.json"):  # sharded weights: the index names tensors too
                index = json.loads(path.read_text())
                index["weight_map"] = {_renamed(k): v for k, v in index.get("weight_map", {}).items()}
                (tmp / path.name).write_text(json.dumps(index, indent=2))
            elif path.is_file() and path.name != "config.json" and path.suffix != ".safetensors":
                shutil.copy2(path, tmp / path.name)
        for path in weights:
            (tmp / path.name).write_bytes(renamed_safetensors(path.read_bytes()))
        config = json.loads((model_dir / "config.json").read_text())
        (tmp / "config.json").write_text(json.dumps(wrapped_config(config), indent=2))
        os.replace(tmp, target)
    except FileExistsError:  # pragma: no cover - another launch wrote it first
        shutil.rmtree(tmp, ignore_errors=True)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (target / "config.json").is_file():
            raise
    return target
