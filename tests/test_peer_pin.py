"""peer_pin: a CUDA decode holds each live prefill's KV allocations open with a NIXL memory view (issue 38), against
a fake NixlPullConnectorWorker with the names the patch touches (manifest.PEER_PIN; test_plugin_compat checks them in
vLLM's source), and NIXL's own answer where no CUDA is (the view refused: the rank is read unpinned)."""

from __future__ import annotations

import logging
import threading
from types import ModuleType, SimpleNamespace

import pytest

from hybridserve.core.vllm_plugin import peer_pin
from hybridserve.core.vllm_plugin.peer_pin import Pins, pin_descs


class FakeWrapper:
    """nixl_agent as far as views go: handles counted, a refusal on demand."""

    def __init__(self, refuse=False):
        self.refuse, self.next, self.live, self.calls = refuse, 100, {}, []

    def get_remote_descs(self, descs, mem_type):
        assert mem_type == "VRAM"
        return list(descs)

    def prep_mem_view(self, dlist):
        self.calls.append(("prep", dlist))
        if self.refuse:
            raise RuntimeError("NIXL_ERR_BACKEND")
        self.next += 1
        self.live[self.next] = dlist
        return self.next

    def release_mem_view(self, handle):
        self.calls.append(("release", handle))
        del self.live[handle]

    def remove_remote_agent(self, name):
        self.calls.append(("remove", name))


def _worker_module():
    """A module with vLLM's worker as the patch sees it: a handshake adds an agent and the rank's region bases."""

    class NixlPullConnectorWorker:
        def __init__(self, wrapper, memory="VRAM"):
            self.nixl_wrapper, self.nixl_memory_type = wrapper, memory
            self._remote_agents, self.kv_caches_base_addr, self.reads = {}, {}, []
            self._handshake_lock, self._handshake_futures = threading.RLock(), {}

        def add_remote_agent(self, nixl_agent_meta, remote_tp_rank=0, remote_tp_size=1):
            name = f"agent-{nixl_agent_meta.engine_id}-{remote_tp_rank}"
            self._remote_agents.setdefault(nixl_agent_meta.engine_id, {})[(0, remote_tp_rank)] = name
            self.kv_caches_base_addr.setdefault(nixl_agent_meta.engine_id, {})[remote_tp_rank] = \
                nixl_agent_meta.kv_caches_base_addr
            return name

        def start_load_kv(self, metadata):
            if metadata == "handshake lands":  # vLLM's background handshake finishes while the step runs
                self.add_remote_agent(_meta("P2", [7000]))
            self.reads.append((metadata, len(self.nixl_wrapper.live)))  # views alive when vLLM posts its READs

        def _cleanup_remote_engine(self, engine_id, *, log_eviction=True):
            for name in self._remote_agents.pop(engine_id).values():
                self.nixl_wrapper.remove_remote_agent(name)
            self.kv_caches_base_addr.pop(engine_id, None)

    module = ModuleType("fake_pull_worker")
    module.NixlPullConnectorWorker = NixlPullConnectorWorker
    peer_pin.patch_worker_module(module)
    return module


def _meta(engine_id, bases, device_id=0):
    return SimpleNamespace(engine_id=engine_id, kv_caches_base_addr=bases, device_id=device_id)


def test_pin_descs_take_one_byte_at_each_distinct_region_base():
    assert pin_descs([4096, 8192, 4096], 3, "agent-P") == [(4096, 1, 3, "agent-P"), (8192, 1, 3, "agent-P")]


def test_a_handshaken_prefill_is_pinned_before_its_first_read_and_released_before_its_agent_goes(caplog):
    wrapper = FakeWrapper()
    worker = _worker_module().NixlPullConnectorWorker(wrapper)
    assert worker.add_remote_agent(_meta("P1", [1000, 2000, 3000], device_id=2)) == "agent-P1-0"
    with caplog.at_level(logging.INFO, logger="vllm.hybridserve"):
        worker.start_load_kv("step-1")
    # the line the served H200 bench collects (benchmarks/served_h200.py peer_pins)
    (line,) = [r.getMessage() for r in caplog.records if peer_pin.PINNED_LOG_PREFIX in r.getMessage()]
    assert line.startswith(f"{peer_pin.PINNED_LOG_PREFIX} P1 rank 0: 3 regions in ") and line.endswith(" ms")
    assert wrapper.calls == [("prep", [(1000, 1, 2, "agent-P1-0"), (2000, 1, 2, "agent-P1-0"),
                                       (3000, 1, 2, "agent-P1-0")])]
    assert worker.reads == [("step-1", 1)]  # the view was there when the READs were posted
    worker.start_load_kv("step-2")
    assert len(wrapper.calls) == 1  # once a rank, not once a step
    worker._cleanup_remote_engine("P1", log_eviction=False)
    assert wrapper.calls[1:] == [("release", 101), ("remove", "agent-P1-0")] and wrapper.live == {}


def test_a_handshake_that_lands_during_a_step_is_pinned_at_its_end():
    wrapper = FakeWrapper()
    worker = _worker_module().NixlPullConnectorWorker(wrapper)
    worker.start_load_kv("handshake lands")
    assert worker.reads == [("handshake lands", 0)] and [c[0] for c in wrapper.calls] == ["prep"]
    assert [d[0][0] for d in wrapper.live.values()] == [7000]


def test_each_remote_rank_gets_its_own_view_and_an_engine_releases_all_of_its_own():
    wrapper = FakeWrapper()
    worker = _worker_module().NixlPullConnectorWorker(wrapper)
    worker.add_remote_agent(_meta("P1", [1000]), 0)
    worker.add_remote_agent(_meta("P1", [5000]), 1)
    worker.add_remote_agent(_meta("P2", [9000]), 0)
    worker.start_load_kv("step")
    assert len(wrapper.live) == 3
    worker._cleanup_remote_engine("P1")
    assert [d[0][0] for d in wrapper.live.values()] == [9000]  # P2's view stays
    assert pins_left(worker) == {("P2", 0)}


def pins_left(worker):
    return set(peer_pin.pins_of(worker).views)


def test_a_refused_view_is_logged_once_and_the_rank_is_read_unpinned(caplog):
    wrapper = FakeWrapper(refuse=True)
    worker = _worker_module().NixlPullConnectorWorker(wrapper)
    worker.add_remote_agent(_meta("P1", [1000]))
    with caplog.at_level(logging.WARNING, logger="vllm.hybridserve"):
        worker.start_load_kv("step-1")
        worker.start_load_kv("step-2")
    assert [c[0] for c in wrapper.calls] == ["prep"]  # not tried again every step
    assert sum(peer_pin.UNPINNED_LOG_PREFIX in r.getMessage() for r in caplog.records) == 1
    assert worker.reads == [("step-1", 0), ("step-2", 0)]  # the READs still ran
    worker._cleanup_remote_engine("P1")  # nothing to release; the agent still goes
    assert wrapper.calls[-1] == ("remove", "agent-P1-0")


def test_a_prefill_back_under_the_same_engine_id_is_pinned_again():
    wrapper = FakeWrapper(refuse=True)
    worker = _worker_module().NixlPullConnectorWorker(wrapper)
    worker.add_remote_agent(_meta("P1", [1000]))
    worker.start_load_kv("step")
    worker._cleanup_remote_engine("P1")
    wrapper.refuse = False
    worker.add_remote_agent(_meta("P1", [2000]))
    worker.start_load_kv("step")
    assert list(wrapper.live.values()) == [[(2000, 1, 0, "agent-P1-0")]]


def test_no_view_is_made_while_a_handshake_is_in_flight():
    """The handshake's thread makes NIXL calls of its own (the agent is not thread-safe): the pin waits a step."""
    wrapper = FakeWrapper()
    worker = _worker_module().NixlPullConnectorWorker(wrapper)
    worker.add_remote_agent(_meta("P1", [1000]))
    worker._handshake_futures["P2"] = object()  # another prefill's handshake, running
    worker.start_load_kv("step-1")
    assert wrapper.calls == []
    worker._handshake_futures.clear()
    worker.start_load_kv("step-2")
    assert [c[0] for c in wrapper.calls] == ["prep"]


def test_a_second_cleanup_of_the_same_engine_releases_nothing_twice():
    wrapper = FakeWrapper()
    worker = _worker_module().NixlPullConnectorWorker(wrapper)
    worker.add_remote_agent(_meta("P1", [1000]))
    worker.start_load_kv("step")
    assert peer_pin.unpin(worker, "P1") == 1 and peer_pin.unpin(worker, "P1") == 0
    assert [c[0] for c in wrapper.calls] == ["prep", "release"]


def test_dram_kv_caches_are_left_alone():
    wrapper = FakeWrapper()
    worker = _worker_module().NixlPullConnectorWorker(wrapper, memory="DRAM")
    worker.add_remote_agent(_meta("P1", [1000]))
    worker.start_load_kv("step")
    assert wrapper.calls == []


def test_a_rank_is_due_only_once_its_bases_are_known():
    pins = Pins(devices={("P1", 0): 0})
    assert pins.due({"P1": {(0, 0): "a"}}, {}) == []
    assert pins.due({"P1": {(0, 0): "a"}}, {"P1": {0: [10]}}) == [(("P1", 0), "a", [10], 0)]


def test_nixl_itself_refuses_a_view_without_cuda_and_the_patch_reads_on():
    """NIXL 1.5.1 on DRAM: `prep_mem_view` needs UCX's GPU device API and a CUDA device; here it raises, which is the
    path a GPU without a device lane takes."""
    pytest.importorskip("nixl")
    import nixl._api as api
    import numpy as np

    config = api.nixl_agent_config(enable_prog_thread=False, backends=["UCX"])
    target, reader = api.nixl_agent("pin-target", config), api.nixl_agent("pin-reader", config)
    buf = np.ones(4096, dtype=np.uint8)
    target.register_memory(target.get_reg_descs([(buf.ctypes.data, buf.nbytes, 0, "")], "DRAM"))
    name = reader.add_remote_agent(target.get_agent_metadata())
    descs = reader.get_remote_descs(pin_descs([buf.ctypes.data], 0, name), "DRAM")
    assert descs.descCount() == 1
    with pytest.raises(Exception, match="NIXL_ERR"):
        reader.prep_mem_view(descs)


def test_with_peer_release_on_top_the_pins_nixl_calls_hold_its_step_lock():
    """The plugin installs peer_pin first (core/vllm_plugin/__init__.py), so that the release's prober thread, which
    calls _cleanup_remote_engine under the step lock, never meets a pin's NIXL call on the step thread."""
    from hybridserve.core.vllm_plugin import peer_release
    from hybridserve.core.vllm_plugin.switches import PluginSettings

    names = [spec.name for spec, _ in plugin_installs(PluginSettings(is_pin_peer_regions=True,
                                                                     is_release_dead_peers=True))]
    assert names.index("peer_pin") < names.index("peer_release")
    # without the release a pin would hold a dead prefill's memory until vLLM's engine TTL: not installed alone
    assert "peer_pin" not in [spec.name for spec, _ in plugin_installs(PluginSettings(is_pin_peer_regions=True))]

    module = _worker_module()  # peer_pin patched
    cls = module.NixlPullConnectorWorker
    cls.get_finished = lambda self: (set(), set())
    peer_release.patch_worker_module(module)  # then peer_release, as the plugin orders them
    held = []

    class Watching(FakeWrapper):
        def prep_mem_view(self, dlist):
            held.append(peer_release.releaser_of(worker).step_lock._is_owned())
            return super().prep_mem_view(dlist)

        def release_mem_view(self, handle):
            held.append(peer_release.releaser_of(worker).step_lock._is_owned())
            super().release_mem_view(handle)

    worker = cls(Watching())
    worker._recving_metadata = {}
    worker.add_remote_agent(_meta("P1", [1000]))
    worker.start_load_kv(SimpleNamespace(reqs_to_recv={}))
    with peer_release.releaser_of(worker).step_lock:  # as the prober releases a dead engine
        assert peer_release.try_release(worker, "P1") is peer_release.Release.RELEASED
    assert held == [True, True]


def plugin_installs(config):
    from hybridserve.core.vllm_plugin import installs

    return installs(config, {})
