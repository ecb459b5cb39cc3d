"""Preflight refuses what vLLM would accept and then corrupt or crash on; one test per refusal."""

from __future__ import annotations

import re
import socket
from dataclasses import replace
from pathlib import Path

import pytest

from hybridserve.core.common.errors import InputError, MissingExtraError
from hybridserve.core.launch.launch_plan import Role, make_launch_plan
from hybridserve.core.launch.preflight import check_pairs, is_tcp_port_free, preflight
from hybridserve.core.launch.topology import EngineInstance, local_topology
from hybridserve.core.model.dtypes import DType

ALWAYS = {"is_module_available": lambda _m: True, "is_port_free": lambda _h, _p: True}


def _topology(**changes):
    return replace(local_topology(base_port=40000), **changes)


def _with(which: str, **changes):
    """The local topology with one field of prefill-0 or decode-0 changed."""
    topology = _topology()
    instance = replace(getattr(topology, which)[0], **changes)
    return replace(topology, **{which: (instance,)})


def test_default_pair_passes():
    preflight(make_launch_plan(_topology(), Role.ALL), **ALWAYS)


@pytest.mark.parametrize("which,field,value,expected", [
    ("decode", "ssm_dtype", DType.BFLOAT16, "--mamba-ssm-cache-dtype (SSM state dtype) differs: prefill-0 has float32, decode-0 has bfloat16"),
    ("prefill", "conv_dtype", DType.FLOAT32, "--mamba-cache-dtype (conv state dtype) differs: prefill-0 has float32, decode-0 has bfloat16"),
    ("decode", "block_size", 512, "block size (tokens) differs: prefill-0 has 256, decode-0 has 512"),
], ids=["ssm-dtype", "conv-dtype", "block-size"])
def test_refuses_mismatched_pair(which, field, value, expected):
    plan = make_launch_plan(_with(which, **{field: value}), Role.ALL)
    with pytest.raises(InputError, match=re.escape(expected)):
        preflight(plan, **ALWAYS)


def test_refuses_different_kernel_block_size():
    # Same logical block, different kernel block: what broke hetero-TP in vLLM issue #42895.
    plan = make_launch_plan(_topology(), Role.ALL)
    (p_name, p_cache), (d_name, d_cache) = plan.caches
    plan = replace(plan, caches=((p_name, p_cache), (d_name, replace(d_cache, layout=replace(d_cache.layout, kernel_block_size=64)))))
    with pytest.raises(InputError, match="kernel block size .* prefill-0 has 256, decode-0 has 64"):
        check_pairs(plan)


def test_refuses_conv_layout_not_ds():
    plan = make_launch_plan(_with("prefill", env=(("VLLM_SSM_CONV_STATE_LAYOUT", "SD"),)), Role.ALL)
    with pytest.raises(InputError, match="prefill-0: VLLM_SSM_CONV_STATE_LAYOUT=SD; accepted: DS"):
        preflight(plan, **ALWAYS)


def test_refuses_tp_not_dividing_heads():
    # the tiny model has 2 KV heads, 4 attention heads, 2 linear key heads: TP 3 divides none of them
    with pytest.raises(InputError, match="decode-0: --tp 3: does not divide tiny-qwen3.5's 4 attention heads"):
        make_launch_plan(_with("decode", tp=3), Role.ALL)


def test_refuses_port_in_use():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        assert not is_tcp_port_free("127.0.0.1", port)
        topology = replace(_topology(), prefill=(EngineInstance(port=port, side_channel_port=40150, devices=(0,)),))
        plan = make_launch_plan(topology, Role.ALL)
        with pytest.raises(InputError, match=f"prefill-0: port {port} on 127.0.0.1 is in use"):
            preflight(plan, is_module_available=lambda _m: True)


def test_refuses_port_given_twice():
    topology = _with("decode", side_channel_port=40100)  # = prefill's HTTP port
    with pytest.raises(InputError, match="decode-0: port 40100 on 127.0.0.1 is also given to prefill-0"):
        preflight(make_launch_plan(topology, Role.ALL), **ALWAYS)


@pytest.mark.parametrize("role,missing,extra", [
    (Role.PREFILL, "nixl", "cpu"), (Role.DECODE, "vllm", "cpu"), (Role.PROXY, "fastapi", "cpu"),
], ids=["prefill-nixl", "decode-vllm", "proxy-fastapi"])
def test_refuses_missing_extra(role, missing, extra):
    plan = make_launch_plan(_topology(), role)
    with pytest.raises(MissingExtraError, match=rf"needs '{missing}': install it with  pip install '[^']*\[{extra}\]'"):
        preflight(plan, is_module_available=lambda m: m != missing, is_port_free=lambda _h, _p: True)


def test_proxy_role_does_not_need_vllm():
    plan = make_launch_plan(_topology(), Role.PROXY)
    preflight(plan, is_module_available=lambda m: m not in ("vllm", "nixl"), is_port_free=lambda _h, _p: True)


def test_tiny_model_folder_is_shipped():
    model = _topology().model
    assert (model / "config.json").is_file() and (model / "model.safetensors").is_file()
    assert Path(model).stat().st_size > 0
