"""Failures with real NIXL rank processes: each ends in a typed error within its deadline, never a hang, and the
decode side keeps working afterwards."""

from __future__ import annotations

import os
import time
from dataclasses import replace

import pytest

pytest.importorskip("torch")
pytest.importorskip("nixl")

from _transfer_cases import plan_for, pool_size, prompt_for

from hybridserve.core.layout.descriptors import Scheme
from hybridserve.core.model.dtypes import DType
from hybridserve.core.layout.rank_layout import plan_layout
from hybridserve.transfer.blocks import Allocation, BlockPool, allocate
from hybridserve.transfer.cluster import PREFILL_SEED, Cluster
from hybridserve.transfer.errors import DescriptorRangeError, IncompatiblePeerError, TransferError, TransferTimeout
from hybridserve.transfer.geometry import RequestBlocks

pytestmark = [pytest.mark.slow, pytest.mark.nixl_agents,  # run beside the server tests (Makefile)
              pytest.mark.xdist_group("nixl_agents")]  # see tests/conftest.py


@pytest.fixture(scope="module")
def small():
    """0.8B, TP 1 -> 1, set up and connected; shared by the cases that leave it working (each asserts it does)."""
    prompt = prompt_for("qwen3.5-0.8b")
    plan = plan_for("qwen3.5-0.8b", 1, 1, prompt=prompt)
    with Cluster(1, 1, wait_s=60) as cluster:
        cluster.setup(plan, pool_size(plan, prompt))
        yield cluster, plan, prompt


def _exact(cluster, plan, prompt, scheme=Scheme.OURS) -> bool:
    n = pool_size(plan, prompt)
    blocks = allocate(BlockPool(n, seed=5), BlockPool(n, seed=6), plan.decode, prompt, Allocation.FRAGMENTED)
    cluster.move(blocks, scheme, f"ok-{time.monotonic()}", timeout_s=30)
    return all(c["is_exact"] for c in cluster.check(blocks, scheme))


@pytest.mark.parametrize("check_ranges", [True, False], ids=["our-check", "nixl-check"])
def test_descriptor_outside_registered_range_is_refused_before_any_byte_moves(small, check_ranges):
    cluster, plan, prompt = small
    n = pool_size(plan, prompt)
    good = allocate(BlockPool(n, seed=1), BlockPool(n, seed=2), plan.decode, prompt, Allocation.CONTIGUOUS)
    outside = (good.prefill[0][:-1] + (n + 10**6,),) + good.prefill[1:]  # last GDN state of group 0: far outside
    bad = RequestBlocks(prompt_tokens=prompt, prefill=outside, decode=good.decode)
    decode = cluster.decode[0]
    expected = DescriptorRangeError if check_ranges else TransferError
    with pytest.raises(expected) as err:
        decode.call("read", 30, request_id="bad", blocks=bad, scheme=Scheme.VLLM, timeout_s=10,
                    check_ranges=check_ranges)
    assert "outside" in str(err.value) if check_ranges else err.value.phase == "prepare"
    assert decode.call("unchanged", 60)  # not one byte of the decode regions moved
    assert _exact(cluster, plan, prompt)  # and the connection still works


def test_peer_killed_mid_transfer_fails_within_timeout_then_restarted_peer_works(tmp_path):
    prompt = 16_000  # ~0.5 GB and ~30k descriptors (vLLM scheme, FlashInfer): long enough to kill into
    plan = plan_for("qwen3.5-397b-a17b", 1, 1, prompt=prompt)
    n = pool_size(plan, prompt)
    with Cluster(1, 1, wait_s=90) as cluster:
        cluster.setup(plan, n)
        blocks = allocate(BlockPool(n, seed=1), BlockPool(n, seed=2), plan.decode, prompt, Allocation.FRAGMENTED)
        started = tmp_path / "posting"
        decode, victim = cluster.decode[0], cluster.prefill[0]
        decode.send("read", request_id="doomed", blocks=blocks, scheme=Scheme.VLLM, timeout_s=20,
                    started_path=str(started))
        deadline = time.monotonic() + 60
        while not started.exists():
            assert time.monotonic() < deadline, "decode never started posting"
            time.sleep(0.001)
        victim.kill()
        t0 = time.monotonic()
        with pytest.raises(TransferError) as err:
            decode.result(40)
        assert time.monotonic() - t0 < 20 + 5  # the error, not the driver's own deadline
        assert err.value.phase == "transfer" and err.value.peer.startswith("prefill0-")
        # restart the peer (a new process, a new agent name) and reconnect: the next request works
        cluster.prefill[0] = cluster.group.start("prefill", 0)
        info = cluster.prefill[0].call("setup", 90, layout=plan.prefill, num_blocks=n, seed=PREFILL_SEED)
        assert info["agent"] != err.value.peer
        decode.call("connect", 60, rank=0, host="127.0.0.1", port=info["port"], layout=plan.prefill, timeout_s=30)
        decode.call("check", 120, blocks=blocks, scheme=Scheme.VLLM, prefill_seeds=[PREFILL_SEED])  # restores pages
        cluster.move(blocks, Scheme.OURS, "after-restart", timeout_s=30)
        assert all(c["is_exact"] for c in cluster.check(blocks, Scheme.OURS))


def test_metadata_before_peer_registered_waits_bounded_then_clear_error():
    plan = plan_for("qwen3.5-0.8b", 1, 1)
    with Cluster(1, 1, wait_s=60) as cluster:
        info = cluster.prefill[0].call("setup", 60, layout=plan.prefill, num_blocks=8, seed=1, register=False)
        cluster.decode[0].call("setup", 60, layout=plan.decode, num_blocks=8, seed=2)
        t0 = time.monotonic()
        with pytest.raises(TransferTimeout) as err:
            cluster.decode[0].call("connect", 30, rank=0, host="127.0.0.1", port=info["port"], layout=plan.prefill,
                                   timeout_s=2.0)
        assert 2.0 <= time.monotonic() - t0 < 10
        assert err.value.phase == "metadata" and err.value.peer == info["agent"]
        assert "not registered" in str(err.value)


def test_handshake_refuses_a_different_ssm_dtype_naming_both():
    plan = plan_for("qwen3.5-0.8b", 1, 1)
    other = plan_layout(replace(plan.prefill.request, ssm_dtype=DType.BFLOAT16, block_size=plan.prefill.block_size))
    with Cluster(1, 1, wait_s=60) as cluster:
        info = cluster.prefill[0].call("setup", 60, layout=plan.prefill, num_blocks=4, seed=1)
        cluster.decode[0].call("setup", 60, layout=plan.decode, num_blocks=4, seed=2)
        with pytest.raises(IncompatiblePeerError, match="ssm_dtype is 'float32' there, 'bfloat16' expected"):
            cluster.decode[0].call("connect", 30, rank=0, host="127.0.0.1", port=info["port"], layout=other,
                                   timeout_s=5)


def test_connect_to_nobody_times_out_naming_the_address():
    plan = plan_for("qwen3.5-0.8b", 1, 1)
    with Cluster(0, 1, wait_s=60) as cluster:
        cluster.decode[0].call("setup", 60, layout=plan.decode, num_blocks=4, seed=2)
        with pytest.raises(TransferTimeout, match="127.0.0.1:9"):
            cluster.decode[0].call("connect", 30, rank=0, host="127.0.0.1", port=9, layout=plan.prefill,
                                   timeout_s=1.0)


def test_no_rank_process_outlives_a_failed_cluster():
    with pytest.raises(RuntimeError):
        with Cluster(1, 1) as cluster:
            pids = [p.process.pid for p in cluster.prefill + cluster.decode]
            raise RuntimeError("boom")
    time.sleep(0.2)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
