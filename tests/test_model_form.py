"""vLLM 0.26's form of the shipped text-only Qwen3.5: the same tensors, the config nested as Qwen3_5Config."""

from __future__ import annotations

import json

import pytest

from hybridserve.core.deployments.target import RECALL_MODEL_DIR
from hybridserve.core.host.model_form import (
    ensure_wrapped, needs_wrapper, renamed_safetensors, wrapped_config, wrapped_dir,
)
from hybridserve.core.launch.topology import TINY_MODEL_DIR

MODELS = pytest.mark.parametrize("model", [TINY_MODEL_DIR, RECALL_MODEL_DIR], ids=["tiny", "recall"])


@MODELS
def test_wrapped_folder_holds_the_same_tensors_under_vllm_026_names(model, tmp_path):
    from safetensors.torch import load_file

    target = ensure_wrapped(model, tmp_path / "wrapped")
    before, after = load_file(model / "model.safetensors"), load_file(target / "model.safetensors")
    assert len(before) == len(after)
    for name, tensor in before.items():  # vLLM 0.26 maps model.language_model.* and lm_head.* (kept as is)
        moved = after["model.language_model." + name[len("model."):] if name.startswith("model.") else name]
        assert moved.dtype == tensor.dtype and moved.equal(tensor)  # bytes unchanged


@MODELS
def test_wrapped_config_is_a_qwen3_5_config_with_the_text_settings_nested(model, tmp_path):
    from transformers import AutoConfig

    target = ensure_wrapped(model, tmp_path / "wrapped")
    text = json.loads((model / "config.json").read_text())
    config = AutoConfig.from_pretrained(target)
    assert type(config).__name__ == "Qwen3_5Config"  # what vLLM 0.26's Qwen3_5ForConditionalGeneration asks for
    assert config.architectures == ["Qwen3_5ForConditionalGeneration"]
    for key in ("hidden_size", "num_hidden_layers", "layer_types", "linear_num_value_heads", "head_dim",
                "vocab_size"):
        assert getattr(config.text_config, key) == text[key]
    assert (target / "tokenizer.json").read_bytes() == (model / "tokenizer.json").read_bytes()
    assert needs_wrapper(model) and not needs_wrapper(target)


def test_safetensors_header_rename_keeps_alignment_and_data():
    import struct

    header = {"model.a": {"dtype": "U8", "shape": [3], "data_offsets": [0, 3]}, "__metadata__": {"x": "y"}}
    blob = json.dumps(header).encode()
    data = struct.pack("<Q", len(blob)) + blob + b"abc"
    out = renamed_safetensors(data)
    size = struct.unpack("<Q", out[:8])[0]
    assert size % 8 == 0 and out[8 + size:] == b"abc"
    assert set(json.loads(out[8:8 + size])) == {"model.language_model.a", "__metadata__"}
    assert renamed_safetensors(out) == out  # already wrapped: unchanged


def test_ensure_wrapped_writes_once_and_never_leaves_a_half_folder(tmp_path):
    target = tmp_path / "w"
    ensure_wrapped(TINY_MODEL_DIR, target)
    stamp = (target / "config.json").stat().st_mtime_ns
    ensure_wrapped(TINY_MODEL_DIR, target)
    assert (target / "config.json").stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == ["w"]  # no temp folder left beside it


def test_wrapped_dir_changes_with_the_source(tmp_path):
    src = tmp_path / "m"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"model_type": "qwen3_5_text", "hidden_size": 128}))
    first = wrapped_dir(src, tmp_path / "cache")
    (src / "config.json").write_text(json.dumps({"model_type": "qwen3_5_text", "hidden_size": 256}))
    assert wrapped_dir(src, tmp_path / "cache") != first
    assert wrapped_config({"model_type": "qwen3_5_text", "tie_word_embeddings": True})["tie_word_embeddings"]


def test_a_sharded_index_is_renamed_with_its_shards(tmp_path):
    import shutil

    src = tmp_path / "m"
    shutil.copytree(TINY_MODEL_DIR, src)
    (src / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {"model.norm.weight": "model.safetensors", "lm_head.weight": "model.safetensors"}}))
    target = ensure_wrapped(src, tmp_path / "w")
    index = json.loads((target / "model.safetensors.index.json").read_text())
    assert index["weight_map"] == {"model.language_model.norm.weight": "model.safetensors",
                                   "lm_head.weight": "model.safetensors"}
