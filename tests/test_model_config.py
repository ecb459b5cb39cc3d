"""Model profiles and config parsing: every shipped profile reads, bad configs are refused in one line."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridserve.core.common.errors import InputError
from hybridserve.core.layout.rank_layout import LayoutRequest, plan_layout
from hybridserve.core.model.model_config import spec_from_config
from hybridserve.core.model.profiles import MODELS_DIR, load_model, model_profile_names
from hybridserve.core.model.spec import LayerKind

# issue 2 facts: layers / hidden / attention heads / KV heads / GDN value heads
FACTS = {
    "qwen3.5-397b-a17b": (60, 4096, 32, 2, 64), "qwen3.5-122b-a10b": (48, 3072, 32, 2, 64),
    "qwen3.5-35b-a3b": (40, 2048, 16, 2, 32), "qwen3.5-27b": (64, 5120, 24, 4, 48),
    "qwen3.5-9b": (32, 4096, 16, 4, 32), "qwen3.5-4b": (32, 2560, 16, 4, 32), "qwen3.5-2b": (24, 2048, 8, 2, 16),
    "qwen3.5-0.8b": (24, 1024, 8, 2, 16), "qwen3-next-80b-a3b": (48, 2048, 16, 2, 32),
}


@pytest.mark.parametrize("name", sorted(FACTS))
def test_profiles_hold_the_published_shapes(name):
    spec = load_model(name)
    gdn = spec.gdn
    assert (spec.num_layers, spec.hidden_size, spec.num_attention_heads, spec.num_kv_heads,
            gdn.num_value_heads) == FACTS[name]
    assert (spec.head_dim, gdn.num_key_heads, gdn.key_head_dim, gdn.value_head_dim, gdn.conv_kernel) == \
        (256, 16, 128, 128, 4)
    assert spec.layers_of(LayerKind.FULL_ATTENTION) == tuple(range(3, spec.num_layers, 4))
    assert (spec.mamba_ssm_dtype is None) == name.startswith("qwen3-next")
    assert spec.source and "config" in spec.source


def test_gemma_has_29_sliding_and_5_full_layers():
    spec = load_model("gemma-3-4b-it")
    assert len(spec.layers_of(LayerKind.SLIDING_ATTENTION)) == 29
    assert spec.layers_of(LayerKind.FULL_ATTENTION) == (5, 11, 17, 23, 29)
    assert spec.sliding_window == 1024


def test_model_folder_and_config_path_and_nested_text_config(tmp_path):
    nested = {"model_type": "qwen3_5",
              "text_config": json.loads((MODELS_DIR / "qwen3.5-9b.json").read_text())["text_config"]}
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(nested))
    by_folder, by_path = load_model(str(folder)), load_model(str(folder / "config.json"))
    assert by_folder == by_path
    assert by_folder.name == "my-model" and by_folder.num_layers == 32


@pytest.mark.parametrize("config, match", [
    ({"model_type": "llama"}, "unsupported model_type 'llama'"),
    ({"model_type": "qwen3_next"}, "num_hidden_layers"),
    ([1, 2], "JSON object"),
    ({"model_type": "qwen3_next", "num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4,
      "layer_types": ["full_attention"]}, "layer_types must list 4"),
    ({"model_type": "qwen3_next", "num_hidden_layers": 4, "hidden_size": -64, "num_attention_heads": 4},
     "hidden_size"),
], ids=["unknown-arch", "missing-field", "not-object", "layer-types-length", "negative"])
def test_bad_configs_are_refused_naming_the_field(config, match):
    with pytest.raises(InputError, match=match):
        spec_from_config(config, name="m")


def test_malformed_json_file_is_refused(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text('{"model_type": ')
    with pytest.raises(InputError, match="not valid JSON"):
        load_model(str(bad))


def test_unknown_profile_lists_the_profiles():
    with pytest.raises(InputError) as info:
        load_model("qwen9")
    assert all(name in str(info.value) for name in model_profile_names())


_BASE = json.loads((MODELS_DIR / "qwen3-next-80b-a3b.json").read_text())
_values = st.one_of(st.none(), st.booleans(), st.integers(-3, 100), st.text(max_size=5),
                    st.lists(st.integers(0, 3), max_size=3), st.floats(allow_nan=True))


@settings(max_examples=300, deadline=None)
@given(changes=st.dictionaries(st.sampled_from(sorted(_BASE)), _values, max_size=4),
       tp=st.sampled_from([1, 2, 3, 4, 8]), drop=st.sets(st.sampled_from(sorted(_BASE)), max_size=2))
def test_random_and_broken_configs_give_a_layout_or_a_one_line_error(changes, tp, drop):
    config = {k: v for k, v in {**_BASE, **changes}.items() if k not in drop}
    try:
        layout = plan_layout(LayoutRequest(model=spec_from_config(config, name="fuzz"), tp=tp))
    except InputError as exc:
        assert "\n" not in str(exc) and str(exc)
        return
    assert layout.block_size % 16 == 0 and layout.page_size_bytes > 0
    if layout.gdn is not None:
        assert layout.page_size_bytes >= layout.gdn.real_page_size_bytes
