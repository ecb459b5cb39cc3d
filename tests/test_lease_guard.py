"""The KV lease guard (issue 39) on fakes of vLLM's NIXL classes: prefill stamps the end of its lease, decode's worker
reads only inside it (heartbeats it saw go out extend it), refuses otherwise, and the scheduler computes a refused
request's prompt again; the proxy drops a decode hop's parameters past the lease and counts what decode refused.
The installed vLLM's real names are checked by test_plugin_compat.py; the served path by test_lease_probes.py."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from types import SimpleNamespace

import httpx
import pytest

from test_proxy import D1, D2, KV, Servers, _client, prefill_answer

from hybridserve.core.common import kv_lease
from hybridserve.core.launch.topology import FirstTokenSource
from hybridserve.core.proxy import failover
from hybridserve.core.vllm_plugin import lease_guard, lease_stamp
from hybridserve.core.vllm_plugin.lease_book import LeaseBook, RefusedLoads, extended

EXT = 20.0  # vLLM's extension for the default 30 s lease: 30 * 2 // 3


@pytest.mark.parametrize("rounds,expected", [
    ([], 10.0),
    ([(5.0, 5.1)], 25.0),  # sent well inside: prefill took it before freeing, at a time after 5.0
    ([(9.0, 10.5)], 10.0),  # the last send returned past the deadline: it may have come too late
    ([(5.0, 5.1), (24.0, 24.2)], 44.0),  # a chain: each in time for the deadline the one before gave
    ([(12.0, 12.1), (5.0, 5.1)], 25.0),  # the first came too late and moves nothing; the second still counts
    ([(1.0, 1.1)], 21.0), ([(-5.0, -4.9)], 15.0),
], ids=["none", "in-time", "too-late", "chain", "late-then-in-time", "early", "before-the-stamp-moves-nothing"])
def test_a_heartbeat_moves_the_deadline_only_when_it_went_out_before_it(rounds, expected):
    assert extended(10.0, rounds, EXT) == max(10.0, expected)


def test_the_book_applies_heartbeats_sent_while_the_request_waited_and_forgets_untracked_ones():
    book = LeaseBook(extension_s=EXT)
    book.heartbeat("P", frozenset({"r1", "r2"}), 5.0, 5.1)
    book.heartbeat("P", frozenset({"r1"}), 10.5, 10.6)  # r2 left the scheduler's list: its history goes
    assert ("P", "r2") not in book.rounds
    assert book.track("d1", "P", "r1", first_deadline=10.0) == 30.5
    book.heartbeat("P", frozenset({"r1"}), 27.0, 27.5)
    book.heartbeat("Q", frozenset({"r1"}), 40.0, 40.1)  # another engine's r1 is another request
    assert book.deadline("d1") == 47.0
    book.finish("d1")
    assert book.deadline("d1") is None and ("P", "r1") not in book.rounds


def test_heartbeats_every_step_are_kept_one_per_quarter_extension_which_only_moves_the_deadline_less():
    """A lease under 6 s gets a heartbeat every scheduler step (lease // 6 == 0): a request waiting a minute must not
    keep thousands of them. Each round only moves a deadline later, so keeping fewer is never unsafe."""
    book = LeaseBook(extension_s=2.0)
    rounds = [(i * 0.01, i * 0.01 + 0.001) for i in range(6000)]  # every 10 ms for 60 s
    for t0, t1 in rounds:
        book.heartbeat("P", frozenset({"r1"}), t0, t1)
    assert len(book.rounds[("P", "r1")]) == 120  # one per 0.5 s
    kept = book.track("d1", "P", "r1", first_deadline=2.0)
    assert kept <= extended(2.0, rounds, 2.0) and kept >= 60.0 - 0.5 + 2.0 - 0.01


def test_a_refusal_says_what_heartbeats_the_book_kept_for_the_request():
    book = LeaseBook(extension_s=EXT)
    assert book.heard("P", "r1", 10.0) == "no heartbeat kept for it"
    book.heartbeat("P", frozenset({"r1"}), 4.0, 4.1)
    book.heartbeat("P", frozenset({"r1"}), 9.0, 9.1)
    assert book.heard("P", "r1", 10.0) == "2 heartbeat(s) kept for it, the first 6.00 s and the last 1.00 s before"
    assert book.heard("Q", "r1", 10.0) == "no heartbeat kept for it"  # another engine's r1


def test_refusals_of_several_workers_merge():
    merged = RefusedLoads(frozenset({"a"})).aggregate(RefusedLoads(frozenset({"b"})))
    assert merged == RefusedLoads(frozenset({"a", "b"}))


@pytest.mark.parametrize("params,now,expired", [
    ({kv_lease.STAMP_KEY: 100.0}, 98.9, False), ({kv_lease.STAMP_KEY: 100.0}, 99.0, True),
    ({}, 1e12, False), (None, 1e12, False), ({kv_lease.STAMP_KEY: "soon"}, 1e12, False),
    ({kv_lease.STAMP_KEY: True}, 1e12, False),
], ids=["inside", "within-the-margin", "no-stamp", "no-params", "not-a-number", "a-bool"])
def test_a_lease_is_over_once_now_reaches_its_stamp_less_the_margin(params, now, expired):
    assert kv_lease.is_expired(params, now, margin_s=1.0) is expired


@pytest.mark.parametrize("text,value", [("", 1.0), ("0.25", 0.25), ("-1", 1.0), ("x", 1.0), ("nan", 1.0)])
def test_the_margin_comes_from_the_environment_when_it_is_a_number_at_least_0(text, value):
    assert kv_lease.margin_from_env({kv_lease.MARGIN_ENV: text}) == value


# --- the worker (lease_guard.py) -------------------------------------------------------------------------------------


class FakeAgent:
    def __init__(self) -> None:
        self.done: set[str] = set()  # handles whose READ is complete
        self.notifs: list[tuple[str, bytes]] = []
        self.failing: set[str] = set()

    def check_xfer_state(self, handle: str) -> str:
        return "DONE" if handle in self.done else "PROC"

    def send_notif(self, agent_name: str, notif_msg: bytes) -> None:
        if agent_name in self.failing:
            raise RuntimeError("peer gone")
        self.notifs.append((agent_name, notif_msg))


def fake_worker_class() -> type:
    class Stats:
        expired = 0

        def record_kv_expired_req(self) -> None:
            Stats.expired += 1

    class NixlPullConnectorWorker:
        """vLLM's pull worker, in short: the names the guard touches, with vLLM's behaviour."""

        def __init__(self) -> None:
            self.nixl_wrapper = FakeAgent()
            self._lease_extension = int(EXT)
            self._recving_transfers = defaultdict(list)
            self._recving_metadata = {}
            self._remote_agents = defaultdict(dict)
            self.xfer_stats = Stats()
            self.posted: list[str] = []
            self._is_hma_required = True  # a hybrid model
            self.failed: list[str] = []

        def _handle_failed_transfer(self, req_id, handle):  # noqa: ANN001 (0.26: reported done, no block invalid)
            self.failed.append(req_id)

        def _read_blocks_for_req(self, req_id, meta):  # noqa: ANN001
            self.posted.append(req_id)
            self._recving_transfers[req_id].append(f"h-{req_id}")

        def _pop_done_transfers(self, transfers):  # noqa: ANN001 (0.26's form: the done ids)
            done = set()
            for req_id, handles in list(transfers.items()):
                if all(self.nixl_wrapper.check_xfer_state(h) == "DONE" for h in handles):
                    done.add(req_id)
                    del transfers[req_id]
            return done

        def _send_heartbeats(self, metadata):  # noqa: ANN001
            for engine_id, info in metadata.heartbeat_by_engine.items():
                for agent in self._remote_agents[engine_id].values():
                    try:
                        self.nixl_wrapper.send_notif(agent, notif_msg=("HB:" + ",".join(info.req_ids)).encode())
                    except Exception:  # noqa: BLE001 (vLLM logs it at debug level and goes on)
                        pass

    lease_guard.patch_worker(NixlPullConnectorWorker)
    return NixlPullConnectorWorker


def meta(remote_id: str, stamp: float | None) -> SimpleNamespace:
    out = SimpleNamespace(local_block_ids=([1], [2]), remote=SimpleNamespace(engine_id="P", request_id=remote_id))
    if stamp is not None:
        setattr(out, lease_guard.STAMP_ATTR, stamp)
    return out


def start(worker, req_id: str, m: SimpleNamespace) -> None:  # noqa: ANN001 (start_load_kv, one request)
    worker._recving_metadata[req_id] = m
    worker._read_blocks_for_req(req_id, m)


def heartbeat(worker, *remote_ids: str) -> None:  # noqa: ANN001
    info = SimpleNamespace(req_ids=set(remote_ids))
    worker._send_heartbeats(SimpleNamespace(heartbeat_by_engine={"P": info}))


@pytest.fixture
def worker(monkeypatch):
    monkeypatch.setenv(kv_lease.MARGIN_ENV, "1.0")
    w = fake_worker_class()()
    w._remote_agents["P"] = {(0, 0): "agent-P0", (0, 1): "agent-P1"}
    return w


def test_a_read_inside_the_lease_is_posted_and_accepted(worker):
    start(worker, "d1", meta("r1", time.time() + 30))
    worker.nixl_wrapper.done.add("h-d1")
    assert worker._pop_done_transfers(worker._recving_transfers) == {"d1"}
    assert worker.posted == ["d1"] and not worker.__dict__[lease_guard.REFUSED]


def test_a_read_past_the_lease_is_not_posted_and_reported_done_and_refused(worker, caplog):
    start(worker, "d1", meta("r1", time.time() + 0.5))  # inside the 1 s margin: prefill may free it any moment
    assert worker.posted == [] and worker._recving_transfers["d1"] == []
    assert worker._pop_done_transfers(worker._recving_transfers) == {"d1"}  # vLLM reports it done, nothing read
    assert worker.__dict__[lease_guard.REFUSED] == {"d1"} and worker.xfer_stats.expired >= 1
    assert any(r.getMessage().startswith(lease_guard.REFUSED_LOG_PREFIX + " d1: its lease ran out")
               for r in caplog.records)


def test_a_read_seen_complete_past_the_lease_is_refused(worker, monkeypatch):
    start(worker, "d1", meta("r1", time.time() + 1.3))
    assert worker.posted == ["d1"]
    worker.nixl_wrapper.done.add("h-d1")
    monkeypatch.setattr(lease_guard.time, "perf_counter", lambda: time.monotonic() + 60)  # a 60 s stall
    assert worker._pop_done_transfers(worker._recving_transfers) == {"d1"}
    assert worker.__dict__[lease_guard.REFUSED] == {"d1"}


def test_heartbeats_to_every_agent_keep_a_waiting_request_alive_and_a_failed_send_does_not(worker, monkeypatch):
    clock = [time.perf_counter()]
    monkeypatch.setattr(lease_guard.time, "perf_counter", lambda: clock[0])
    stamp = time.time() + 3.0  # deadline: now + 2 (the margin taken)
    for _ in range(5):  # a heartbeat every 1.5 s while the request waits in decode's queue: 7.5 s, past the stamp
        heartbeat(worker, "r1")
        clock[0] += 1.5
    start(worker, "d1", meta("r1", stamp))
    assert worker.posted == ["d1"]  # the last heartbeat, 1.5 s ago, holds it to then + 20
    worker.nixl_wrapper.failing.add("agent-P1")  # one agent of the engine did not get the next one
    heartbeat(worker, "r1")
    clock[0] += EXT
    worker.nixl_wrapper.done.add("h-d1")
    assert worker._pop_done_transfers(worker._recving_transfers) == {"d1"}
    assert worker.__dict__[lease_guard.REFUSED] == {"d1"}  # 21.5 s after the last heartbeat that reached them all


def test_a_request_without_a_stamp_is_read_as_vllm_reads_it(worker, monkeypatch):
    start(worker, "d1", meta("r1", None))
    monkeypatch.setattr(lease_guard.time, "perf_counter", lambda: time.monotonic() + 3600)
    worker.nixl_wrapper.done.add("h-d1")
    assert worker._pop_done_transfers(worker._recving_transfers) == {"d1"}
    assert worker.posted == ["d1"] and not worker.__dict__[lease_guard.REFUSED]


def test_on_vllm_0_26_a_failed_receive_of_a_hybrid_model_is_refused_not_answered_from(worker):
    """vllm#52234: 0.26 reports it as received and marks no block invalid for a hybrid model."""
    start(worker, "d1", meta("r1", time.time() + 30))
    worker._handle_failed_transfer("d1", "h-d1")
    assert worker.failed == ["d1"] and worker.__dict__[lease_guard.REFUSED] == {"d1"}
    worker._is_hma_required = False  # vLLM marks the blocks invalid itself and applies the policy
    worker._handle_failed_transfer("d2", None)
    assert worker.__dict__[lease_guard.REFUSED] == {"d1"}


def test_a_read_is_not_refused_before_the_prefill_engines_handshake(worker):
    """vLLM's bookkeeping of a finished receive looks the engine up: 0.32's original starts the handshake first."""
    del worker._remote_agents["P"]
    start(worker, "d1", meta("r1", time.time()))
    assert worker.posted == ["d1"] and not worker.__dict__[lease_guard.REFUSED]


def test_the_connector_hands_the_steps_refusals_to_the_scheduler_once():
    class Connector:
        def build_connector_worker_meta(self):  # noqa: ANN202 (vLLM's base: nothing)
            return None

    lease_guard.patch_connector(Connector)
    connector = Connector()
    connector.connector_worker = SimpleNamespace(**{lease_guard.REFUSED: {"d1", "d2"},
                                                    lease_guard.LOCK: threading.Lock()})
    assert connector.build_connector_worker_meta() == RefusedLoads(frozenset({"d1", "d2"}))
    assert connector.build_connector_worker_meta() is None


# --- the scheduler (lease_stamp.py) ----------------------------------------------------------------------------------


def fake_scheduler_module() -> SimpleNamespace:
    RequestStatus = SimpleNamespace(WAITING_FOR_REMOTE_KVS="waiting_for_remote_kvs", RUNNING="running")

    class Scheduler:
        def __init__(self) -> None:
            self.requests, self.failed_recving_kv_req_ids, self.seen = {}, set(), []

        def _update_from_kv_xfer_finished(self, kv_connector_output):  # noqa: ANN001
            self.seen.append(set(kv_connector_output.finished_recving))

    module = SimpleNamespace(Scheduler=Scheduler, RequestStatus=RequestStatus)
    lease_stamp.patch_scheduler(module)
    return module


def test_the_scheduler_computes_a_refused_request_again_and_its_answer_says_so():
    module = fake_scheduler_module()
    scheduler = module.Scheduler()
    waiting = SimpleNamespace(status="waiting_for_remote_kvs", num_computed_tokens=96,
                              kv_transfer_params={"do_remote_prefill": False})
    running = SimpleNamespace(status="running", num_computed_tokens=96, kv_transfer_params={})
    scheduler.requests = {"d1": waiting, "d2": running}
    output = SimpleNamespace(finished_recving={"d1"}, kv_connector_worker_meta=RefusedLoads(frozenset({"d1", "d2"})))
    scheduler._update_from_kv_xfer_finished(output)
    assert waiting.num_computed_tokens == 0 and scheduler.failed_recving_kv_req_ids == {"d1"}  # vLLM's recompute
    assert running.num_computed_tokens == 96  # not waiting for its KV: nothing to undo
    assert scheduler.seen == [{"d1"}]  # vLLM's own bookkeeping runs after

    class PullScheduler:
        def request_finished(self, request, block_ids):  # noqa: ANN001 (decode: vLLM returns no parameters)
            return False, None

    lease_stamp.patch_pull_scheduler(PullScheduler)
    request = SimpleNamespace(request_id="d1", kv_transfer_params=waiting.kv_transfer_params)
    delay, params = PullScheduler().request_finished(request, ([1],))
    assert kv_lease.is_refused({"kv_transfer_params": params})


def test_prefill_stamps_the_end_of_the_lease_vllm_just_set():
    class PullScheduler:
        def __init__(self) -> None:
            self._reqs_need_send = {}

        def request_finished(self, request, block_ids):  # noqa: ANN001 (vLLM: the lease starts now)
            self._reqs_need_send[request.request_id] = time.perf_counter() + 30
            return True, {"do_remote_prefill": True, "remote_request_id": request.request_id}

    lease_stamp.patch_pull_scheduler(PullScheduler)
    before = time.time()
    _, params = PullScheduler().request_finished(SimpleNamespace(request_id="p1", kv_transfer_params={}), ([1],))
    assert before + 30 - 0.01 <= params[kv_lease.STAMP_KEY] <= time.time() + 30 + 0.01


def test_the_stamp_rides_on_the_requests_metadata_to_the_worker():
    class NixlConnectorMetadata:
        def __init__(self) -> None:
            self.reqs_to_recv = {}

        def add_new_req_to_recv(self, request_id, local_block_ids, kv_transfer_params):  # noqa: ANN001
            self.reqs_to_recv[request_id] = SimpleNamespace()

    lease_stamp.patch_metadata(NixlConnectorMetadata)
    metadata = NixlConnectorMetadata()
    metadata.add_new_req_to_recv(request_id="d1", local_block_ids=([1],),
                                 kv_transfer_params={kv_lease.STAMP_KEY: 123.5})
    metadata.add_new_req_to_recv("d2", ([1],), {})
    assert getattr(metadata.reqs_to_recv["d1"], lease_guard.STAMP_ATTR) == 123.5
    assert not hasattr(metadata.reqs_to_recv["d2"], lease_guard.STAMP_ATTR)


# --- the proxy -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("source", list(FirstTokenSource))
def test_the_proxy_sends_a_decode_hop_past_the_lease_without_the_parameters_and_counts_it(source):
    expired = {**KV, kv_lease.STAMP_KEY: time.time() - 5}
    servers = Servers(prefill_answer=prefill_answer(kv=expired))
    with _client(servers, first_token=source) as client:
        answer = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 8})
        metrics = client.get("/metrics").text
    assert answer.status_code == 200
    assert "kv_transfer_params" not in servers.seen[1][1]  # decode computes the prompt itself
    assert 'hybridserve_proxy_lease_total{action="dropped"} 1' in metrics.splitlines()


def test_the_proxy_keeps_the_parameters_inside_the_lease_and_counts_what_decode_refused():
    live = {**KV, kv_lease.STAMP_KEY: time.time() + 30}
    servers = Servers(prefill_answer=prefill_answer(kv=live), decode_params={kv_lease.REFUSED_KEY: kv_lease.REFUSED})
    with _client(servers, decode=(D1, D2)) as client:
        answer = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 8})
        metrics = client.get("/metrics").text
    assert answer.status_code == 200 and servers.seen[1][1]["kv_transfer_params"] == live
    lines = metrics.splitlines()
    assert 'hybridserve_proxy_lease_total{action="refused"} 1' in lines
    assert not any('action="dropped"' in line for line in lines)


def test_a_retry_on_another_decode_past_the_lease_goes_without_the_parameters(monkeypatch):
    """d1 refused the connection (it never saw the request: the blocks are untouched), but the lease ran out by the
    time of the retry on d2."""
    stamp = time.time() + 30
    clock = iter([stamp - 20, stamp + 5])  # the lease as each decode hop begins
    monkeypatch.setattr(failover, "now_unix", lambda: next(clock))
    live = {**KV, kv_lease.STAMP_KEY: stamp}
    servers = Servers(prefill_answer=prefill_answer(kv=live), fail={"d1": httpx.ConnectError("refused")})
    with _client(servers, decode=(D1, D2)) as client:
        answer = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 8})
    assert answer.status_code == 200 and [h for h, _, _ in servers.seen] == ["p1", "d1", "d2"]
    assert servers.seen[1][1]["kv_transfer_params"] == live and "kv_transfer_params" not in servers.seen[2][1]
