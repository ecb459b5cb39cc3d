"""The decode-side NIXL completion poller and late poll (core/vllm_plugin/nixl_poll.py), on fakes of vLLM's pull
worker and NIXL agent, plus the names of the installed vLLM's real NixlPullConnectorWorker."""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from types import SimpleNamespace

import pytest

from hybridserve.core.vllm_plugin import nixl_poll

INTERVAL_S = 0.0005


class Handle:
    """Stands in for nixl_xfer_handle: `ready` is when the bytes landed; `_released` as nixl 1.5.1 sets it."""

    def __init__(self) -> None:
        self.ready, self._released = False, False


class FakeAgent:
    def __init__(self) -> None:
        self.checks: list[tuple[Handle, str]] = []  # (handle, thread name)

    def check_xfer_state(self, handle: Handle) -> str:
        self.checks.append((handle, threading.current_thread().name))
        return "DONE" if handle.ready else "PROC"

    def release_xfer_handle(self, handle: Handle) -> None:
        handle._released = True


def fake_module(**drop: bool) -> SimpleNamespace:
    class NixlPullConnectorWorker:
        device_type = "cpu"

        def __init__(self) -> None:
            self.nixl_wrapper = FakeAgent()
            self._recving_transfers = defaultdict(list)
            self.steps = 0

        def start_load_kv(self, metadata: list[tuple[str, Handle]]) -> None:
            for req_id, handle in metadata:
                self._recving_transfers[req_id].append(handle)

        def _pop_done_transfers(self, transfers: dict) -> set[str]:  # vLLM's loop, in short
            done = set()
            for req_id, handles in list(transfers.items()):
                left = [h for h in handles if self.nixl_wrapper.check_xfer_state(h) == "PROC"]
                for h in set(handles) - set(left):
                    self.nixl_wrapper.release_xfer_handle(h)
                if left:
                    transfers[req_id] = left
                else:
                    done.add(req_id)
                    del transfers[req_id]
            return done

        def get_finished(self) -> tuple[set[str], set[str]]:
            self.steps += 1
            return set(), self._pop_done_transfers(self._recving_transfers)

    for name in drop:
        delattr(NixlPullConnectorWorker, name)
    return SimpleNamespace(__name__="fake_pull_worker", NixlPullConnectorWorker=NixlPullConnectorWorker)


def wait_for(predicate, timeout_s: float = 2.0) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.001)
    return predicate()


@pytest.fixture
def worker():
    module = fake_module()
    assert nixl_poll.patch_pull_worker(module, INTERVAL_S)
    made = module.NixlPullConnectorWorker()
    yield made
    made._hybridserve_poller.stop()


def test_completion_is_seen_between_steps(worker):
    handle = Handle()
    worker.start_load_kv([("req-1", handle)])
    poller = worker._hybridserve_poller
    assert wait_for(lambda: len(worker.nixl_wrapper._inner.checks) >= 3)  # polled with no step running
    assert not poller.is_done(handle)
    handle.ready = True  # the READ lands while no step runs
    assert wait_for(lambda: poller.is_done(handle))
    assert worker.steps == 0
    assert {thread for _, thread in worker.nixl_wrapper._inner.checks} == {"hybridserve-nixl-poll"}
    assert worker.get_finished() == (set(), {"req-1"})  # vLLM's own poll still reports (and releases) it
    assert handle._released


def test_no_polling_while_nothing_is_in_flight(worker):
    agent = worker.nixl_wrapper._inner
    time.sleep(0.1)
    assert agent.checks == []  # idle from the start
    handle = Handle()
    worker.start_load_kv([("req-1", handle)])
    handle.ready = True
    assert wait_for(lambda: worker._hybridserve_poller.is_done(handle))
    worker.get_finished()
    time.sleep(0.02)  # the poller's last pass ends
    before = len(agent.checks)
    time.sleep(0.2)  # 400 intervals
    assert len(agent.checks) == before
    assert not worker._hybridserve_poller._done  # no popped handle kept alive


def test_a_handle_seen_done_is_not_checked_again(worker):
    handle = Handle()
    handle.ready = True
    worker.start_load_kv([("req-1", handle)])
    assert wait_for(lambda: worker._hybridserve_poller.is_done(handle))
    time.sleep(0.05)
    assert sum(1 for h, _ in worker.nixl_wrapper._inner.checks if h is handle) == 1


def test_a_released_handle_is_skipped():
    agent, lock = FakeAgent(), threading.RLock()
    released = Handle()
    released._released = True
    poller = nixl_poll.Poller(agent, {"req-1": [released]}, lock, INTERVAL_S)
    assert poller.poll_once() == 1
    assert agent.checks == []


def test_the_worker_agent_calls_share_the_poller_lock(worker):
    """While the poller is inside an agent call, the worker's own agent calls wait (SYNC_NONE agent)."""
    lock = worker._hybridserve_poller._lock
    entered = threading.Event()

    def hold() -> None:
        with lock:
            entered.set()
            time.sleep(0.1)

    holder = threading.Thread(target=hold)
    holder.start()
    entered.wait()
    start = time.monotonic()
    worker.nixl_wrapper.check_xfer_state(Handle())
    assert time.monotonic() - start >= 0.05
    holder.join()


def test_late_poll_waits_for_the_stream_only_with_reads_in_flight(worker, monkeypatch):
    torch = pytest.importorskip("torch")
    syncs = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: SimpleNamespace(synchronize=lambda: syncs.append(1)))
    worker.device_type = "cuda"
    worker.get_finished()
    assert syncs == []  # nothing in flight: no cost
    worker._hybridserve_poller.stop()  # so the poller cannot see the handle end first
    worker._hybridserve_poller.thread.join(1)
    worker.start_load_kv([("req-1", Handle())])
    worker.get_finished()
    assert syncs == [1]
    worker.device_type = "cpu"
    worker.get_finished()
    assert syncs == [1]  # CPU: never


def test_switch_off_installs_nothing(monkeypatch):
    for env in ({}, {"HYBRIDSERVE_NIXL_POLL": "0"}, {"HYBRIDSERVE_NIXL_POLL": ""}):
        assert nixl_poll.poll_us_from_env(env) is None
    assert nixl_poll.poll_us_from_env({"HYBRIDSERVE_NIXL_POLL": "1"}) == nixl_poll.DEFAULT_POLL_US
    assert nixl_poll.poll_us_from_env({"HYBRIDSERVE_NIXL_POLL": "1", "HYBRIDSERVE_NIXL_POLL_US": "200"}) == 200
    import hybridserve.core.vllm_plugin as plugin

    calls = []
    monkeypatch.setattr(nixl_poll, "install", calls.append)
    for module, name in ((plugin.torchvision_shim, "install_lazy"), (plugin.async_scheduling, "install_scheduler_log"),
                         (plugin.transfer_log, "install"), (plugin.cpu_conv_layout, "install"),
                         (plugin.faults, "install_from_env")):
        monkeypatch.setattr(module, name, lambda: None)  # register's always-on patches: not this test's
    for name in ("HYBRIDSERVE_NIXL_POLL", "HYBRIDSERVE_PLUGIN_DISABLE", "HYBRIDSERVE_TIMELINE_FILE",
                 "HYBRIDSERVE_FAULT", "HYBRIDSERVE_FAULT_FILE"):
        monkeypatch.delenv(name, raising=False)
    plugin.register()
    assert calls == []
    monkeypatch.setenv("HYBRIDSERVE_NIXL_POLL", "1")
    plugin.register()
    assert calls == [nixl_poll.DEFAULT_POLL_US]


def test_missing_name_warns_once_and_leaves_the_class_alone(caplog):
    module = fake_module(_pop_done_transfers=True)
    cls = module.NixlPullConnectorWorker
    before = dict(vars(cls))
    with caplog.at_level(logging.WARNING, logger="vllm.hybridserve"):
        assert not nixl_poll.patch_pull_worker(module, INTERVAL_S)
    assert dict(vars(cls)) == before
    assert [r.message for r in caplog.records if "nixl_poll" in r.message] == [
        "hybridserve nixl_poll: NixlPullConnectorWorker has no _pop_done_transfers; poll stays off"]
    assert not hasattr(cls(), "_hybridserve_poller")


def test_worker_without_the_agent_stays_off(caplog):
    module = fake_module()
    cls = module.NixlPullConnectorWorker
    original_init = cls.__init__

    def init_without_transfers(self) -> None:
        original_init(self)
        del self._recving_transfers

    cls.__init__ = init_without_transfers
    assert nixl_poll.patch_pull_worker(module, INTERVAL_S)
    with caplog.at_level(logging.WARNING, logger="vllm.hybridserve"):
        made = cls()
    assert isinstance(made.nixl_wrapper, FakeAgent)  # not wrapped, no poller
    assert not hasattr(made, "_hybridserve_poller")
    assert any("poll stays off" in r.message for r in caplog.records)


def test_installed_vllm_worker_has_the_names():
    """The installed vLLM (0.32 here; 0.26 has the same names, results method get_finished) fits the patch."""
    from hybridserve.core.vllm_plugin import torchvision_shim

    torchvision_shim.install_lazy()
    pull_worker = pytest.importorskip("vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_worker")
    sub = type("NixlPullConnectorWorker", (pull_worker.NixlPullConnectorWorker,), {})
    module = SimpleNamespace(__name__="sub", NixlPullConnectorWorker=sub)
    assert nixl_poll.patch_pull_worker(module, INTERVAL_S)
    assert sub.get_transfer_results is not pull_worker.NixlPullConnectorWorker.get_transfer_results
