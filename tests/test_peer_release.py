"""peer_release: a dead prefill's NIXL state given back by decode (issue 30), against a fake worker that has the names
the patch touches (manifest.PEER_RELEASE; test_plugin_compat checks them in vLLM's source) and real sockets."""

from __future__ import annotations

import logging
import socket
import threading
from types import SimpleNamespace

import pytest

from hybridserve.core.vllm_plugin import peer_release
from hybridserve.core.vllm_plugin.peer_release import PeerWatch, Probe, Release, Releaser, probe, try_release


class FakeWorker:
    """vLLM's NixlPullConnectorWorker as far as the release goes: agents per engine, requests reading, handshakes."""

    def __init__(self, engines=("P1",)):
        self._remote_agents = {e: {(0, 0): f"agent-{e}"} for e in engines}
        self._recving_metadata = {}
        self._handshake_futures = {}
        self._handshake_lock = threading.RLock()
        self.cleaned = []

    def _cleanup_remote_engine(self, engine_id, *, log_eviction=True):
        assert not log_eviction and engine_id in self._remote_agents
        self._remote_agents.pop(engine_id)
        self.cleaned.append(engine_id)


def _meta(engine_id, port=1):
    return SimpleNamespace(remote=SimpleNamespace(engine_id=engine_id, host="127.0.0.1", port=port))


@pytest.fixture
def listener():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    yield sock
    sock.close()


def test_probe_tells_a_listener_from_a_closed_port(listener):
    port = listener.getsockname()[1]
    assert probe("127.0.0.1", port) is Probe.UP
    listener.close()
    assert probe("127.0.0.1", port) is Probe.REFUSED


def test_probe_timeout_says_nothing(monkeypatch):
    def timeout(*_args, **_kwargs):
        raise TimeoutError("timed out")

    monkeypatch.setattr(socket, "create_connection", timeout)
    assert probe("10.0.0.1", 5600) is Probe.UNKNOWN


@pytest.mark.parametrize("probes, is_dead", [
    pytest.param([Probe.REFUSED], False, id="one-refusal"),
    pytest.param([Probe.REFUSED, Probe.REFUSED], True, id="two-in-a-row"),
    pytest.param([Probe.REFUSED, Probe.UP, Probe.REFUSED], False, id="up-between-resets"),
    pytest.param([Probe.REFUSED, Probe.UNKNOWN, Probe.REFUSED], True, id="unknown-neither-counts-nor-resets"),
    pytest.param([Probe.UNKNOWN] * 5, False, id="unreachable-is-not-dead"),
])
def test_watch_counts_refusals_in_a_row(probes, is_dead):
    watch = PeerWatch()
    watch.note("P1", "127.0.0.1", 5600)
    assert [watch.observe("P1", p) for p in probes][-1] is is_dead


@pytest.mark.parametrize("setup, outcome", [
    pytest.param(lambda w: w._remote_agents.clear(), Release.GONE, id="no-agents"),
    pytest.param(lambda w: w._handshake_futures.update(P2=object()), Release.HANDSHAKING, id="handshake-in-flight"),
    pytest.param(lambda w: w._recving_metadata.update(r1=_meta("P1")), Release.READING, id="a-request-reads-it"),
    pytest.param(lambda w: w._recving_metadata.update(r1=_meta("P2"), r2=SimpleNamespace(remote=None)),
                 Release.RELEASED, id="others-read"),
])
def test_try_release_waits_for_what_still_needs_the_engine(setup, outcome):
    worker = FakeWorker(engines=("P1", "P2"))
    setup(worker)
    assert try_release(worker, "P1") is outcome
    assert worker.cleaned == (["P1"] if outcome is Release.RELEASED else [])


def test_a_dead_side_channel_releases_its_engine_once_its_reads_end(listener, caplog):
    worker = FakeWorker(engines=("P1", "P2"))
    releaser = Releaser(worker)
    port = listener.getsockname()[1]
    releaser.note(SimpleNamespace(reqs_to_recv={"r1": _meta("P1", port), "r2": _meta("P2", port)}))
    releaser.stop()  # rounds driven by hand below
    assert releaser.watch.addresses == {"P1": ("127.0.0.1", port), "P2": ("127.0.0.1", port)}
    assert releaser.run_once() == [] and worker.cleaned == []  # alive
    listener.close()
    worker._recving_metadata["r1"] = _meta("P1", port)  # P1 still has a read in flight
    assert releaser.run_once() == []  # one refusal is not yet dead
    with caplog.at_level(logging.INFO, logger="vllm.hybridserve"):
        assert releaser.run_once() == ["P2"]
        del worker._recving_metadata["r1"]
        assert releaser.run_once() == ["P1"]
    assert worker.cleaned == ["P2", "P1"] and releaser.watch.addresses == {}
    assert [r.getMessage().split(" at ")[0] for r in caplog.records] == [
        f"{peer_release.RELEASED_LOG_PREFIX} P2", f"{peer_release.RELEASED_LOG_PREFIX} P1"]
    assert releaser.run_once() == []  # nothing left to probe


def test_the_release_waits_for_the_step_thread():
    """A release never runs while the step thread is inside start_load_kv or the per-step result call."""
    worker = FakeWorker()
    releaser = Releaser(worker, probe_fn=lambda _host, _port: Probe.REFUSED)
    releaser.note(SimpleNamespace(reqs_to_recv={"r1": _meta("P1")}))
    releaser.stop()
    releaser.run_once()  # first refusal
    done = threading.Event()
    with releaser.step_lock:
        thread = threading.Thread(target=lambda: (releaser.run_once(), done.set()))
        thread.start()
        assert not done.wait(0.3) and worker.cleaned == []
    thread.join(5)
    assert done.is_set() and worker.cleaned == ["P1"]


def test_an_engine_never_handshaken_is_not_probed():
    worker = FakeWorker(engines=())
    calls = []
    releaser = Releaser(worker, probe_fn=lambda host, port: calls.append(port) or Probe.REFUSED)
    releaser.note(SimpleNamespace(reqs_to_recv={"r1": _meta("P9", 7)}))
    releaser.stop()
    assert releaser.run_once() == [] and calls == []
    worker._remote_agents["P9"] = {(0, 0): "agent"}  # the handshake landed
    releaser.run_once()
    releaser.run_once()
    assert calls == [7, 7] and worker.cleaned == ["P9"]


@pytest.mark.parametrize("results_name", ["get_transfer_results", "get_finished"], ids=["vllm-0.32", "vllm-0.26"])
def test_patch_wraps_the_step_calls_under_the_release_lock(results_name):
    seen = {}

    class Worker(FakeWorker):
        def start_load_kv(self, metadata):
            seen["start_lock_held"] = releaser_lock_held(self)
            return "started"

    def results(self):
        seen["results_lock_held"] = releaser_lock_held(self)
        return "results"

    def releaser_lock_held(worker):
        lock = peer_release.releaser_of(worker).step_lock
        held = [False]

        def try_lock():
            held[0] = not lock.acquire(blocking=False)
            if not held[0]:
                lock.release()

        thread = threading.Thread(target=try_lock)
        thread.start()
        thread.join()
        return held[0]

    setattr(Worker, results_name, results)
    peer_release.patch_worker_module(SimpleNamespace(NixlPullConnectorWorker=Worker))
    peer_release.patch_worker_module(SimpleNamespace(NixlPullConnectorWorker=Worker))  # once only
    worker = Worker(engines=())
    assert worker.start_load_kv(SimpleNamespace(reqs_to_recv={"r1": _meta("P1", 9)})) == "started"
    assert getattr(worker, results_name)() == "results"
    assert seen == {"start_lock_held": True, "results_lock_held": True}
    releaser = peer_release.releaser_of(worker)
    assert releaser.watch.addresses == {"P1": ("127.0.0.1", 9)} and releaser.thread is not None
    releaser.stop()
