"""GPU placement: counting without torch, roles on GPU ids (never core ids), memory shares, staggered starts."""

from __future__ import annotations

import pytest

from hybridserve.core.common.errors import InputError
from hybridserve.core.host.gpus import count_gpus, parse_smi_list
from hybridserve.core.launch.gpu_shares import MAX_TOTAL_SHARE, check_gpus_exist, memory_shares, start_waves
from hybridserve.core.launch.launch_plan import Role, make_launch_plan
from hybridserve.core.launch.topology import Device, local_topology

SMI_TWO = ("GPU 0: NVIDIA H200 (UUID: GPU-c3fbd34e-333c-b84b-75d2-81d8feda572f)\n"
           "GPU 1: NVIDIA H200 (UUID: GPU-99a825da-cb62-9f37-479b-eafd3f791d7a)\n"
           "  MIG 1g.18gb     Device  0: (UUID: MIG-5c0e6a9f-0000-0000-0000-000000000000)\n")


def test_smi_list_counts_gpus_not_mig_devices():
    assert parse_smi_list(SMI_TWO) == 2
    assert parse_smi_list("") == 0


@pytest.mark.parametrize("nvml, smi, expected", [(1, 8, 1), (None, 2, 2), (None, None, 0), (0, 4, 0)],
                         ids=["nvml-first", "smi-fallback", "cpu-host", "nvml-says-none"])
def test_count_gpus_asks_nvml_then_nvidia_smi(nvml, smi, expected):
    assert count_gpus(nvml=lambda: nvml, smi=lambda: smi) == expected


@pytest.mark.parametrize("num_roles, each", [(1, 0.92), (2, 0.46), (3, 0.306), (4, 0.23)])
def test_roles_on_one_gpu_split_it_and_stay_under_095(num_roles, each):
    shares = memory_shares([(f"r{i}", (0,)) for i in range(num_roles)])
    assert set(shares.values()) == {each}
    assert sum(shares.values()) <= MAX_TOTAL_SHARE


def test_separate_gpus_keep_the_whole_share_and_tp_takes_the_smallest():
    shares = memory_shares([("prefill-0", (0, 1)), ("decode-0", (1,)), ("decode-1", (2,))], total=0.95)
    assert shares == {"prefill-0": 0.475, "decode-0": 0.475, "decode-1": 0.95}


def test_fixed_shares_are_kept_and_the_rest_split_what_is_left():
    shares = memory_shares([("prefill-0", (0,)), ("decode-0", (0,))], fixed={"prefill-0": 0.6})
    assert shares == {"prefill-0": 0.6, "decode-0": 0.32}  # 0.92 - 0.6


@pytest.mark.parametrize("placements, fixed, total, words", [
    ([("a", (0,)), ("b", (0,))], {"a": 0.6, "b": 0.5}, 0.9, "GPU 0: gpu_memory_utilization of a, b sum to 1.100"),
    ([("a", (0,))], {}, 0.99, "--gpu-memory-utilization 0.99: accepted: more than 0, at most 0.95"),
], ids=["over-budget", "total-too-big"])
def test_shares_over_the_limit_are_refused_in_one_line(placements, fixed, total, words):
    with pytest.raises(InputError) as err:
        memory_shares(placements, total=total, fixed=fixed)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_roles_sharing_a_gpu_start_one_after_the_other():
    assert start_waves([("prefill-0", (0,)), ("decode-0", (0,))]) == [["prefill-0"], ["decode-0"]]
    assert start_waves([("prefill-0", (0,)), ("decode-0", (1,)), ("decode-1", (0,))]) == [
        ["prefill-0", "decode-0"], ["decode-1"]]
    assert start_waves([("prefill-0", ()), ("decode-0", ())]) == [["prefill-0", "decode-0"]]  # CPU: together


def test_engines_with_a_fixed_kv_cache_start_together_unless_a_profiling_one_shares_their_gpu():
    both = frozenset({"prefill-0", "decode-0"})
    assert start_waves([("prefill-0", (0,)), ("decode-0", (0,))], both) == [["prefill-0", "decode-0"]]
    # decode-1 sizes its cache from free memory on GPU 0: GPU 0's engines start one by one again
    assert start_waves([("prefill-0", (0,)), ("decode-0", (0,)), ("decode-1", (0,))], both) == [
        ["prefill-0"], ["decode-0"], ["decode-1"]]
    # GPU 1 all fixed, GPU 0 not: GPU 1's pair starts at once beside GPU 0's first
    assert start_waves([("prefill-0", (1,)), ("decode-0", (1,)), ("single-0", (0,)), ("single-1", (0,))], both) == [
        ["prefill-0", "decode-0", "single-0"], ["single-1"]]


def test_a_gpu_the_host_lacks_is_refused_in_one_line():
    check_gpus_exist([("prefill-0", (0,)), ("decode-0", (0,))], 1)
    with pytest.raises(InputError) as err:
        check_gpus_exist([("prefill-0", (0,)), ("decode-0", (1,))], 1)
    assert str(err.value) == "decode-0: GPU 1 does not exist; this host has GPUs 0..0"
    with pytest.raises(InputError, match="prefill-0: GPU 0 does not exist; this host has no GPU"):
        check_gpus_exist([("prefill-0", (0,))], 0)


@pytest.mark.parametrize("num_gpus, decode_gpu", [(1, "0"), (2, "1"), (8, "1")])
def test_local_cuda_topology_uses_gpu_ids_not_the_last_core(num_gpus, decode_gpu):
    """Issue 14: a 16-core 1-GPU host gave decode CUDA_VISIBLE_DEVICES=15 (the CPU core rule)."""
    plan = make_launch_plan(local_topology(device=Device.CUDA, num_cores=16, num_gpus=num_gpus), Role.ALL)
    env = {c.name: dict(c.env) for c in plan.commands}
    assert env["prefill-0"]["CUDA_VISIBLE_DEVICES"] == "0"
    assert env["decode-0"]["CUDA_VISIBLE_DEVICES"] == decode_gpu
    shares = [c.gpu_memory_utilization for c in plan.commands if c.gpus is not None]
    assert shares == ([0.46, 0.46] if num_gpus == 1 else [0.92, 0.92])  # vLLM's 0.92, split on one GPU
    for c in plan.commands[:2]:
        assert c.argv[c.argv.index("--gpu-memory-utilization") + 1] == str(c.gpu_memory_utilization)
