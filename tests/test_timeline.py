"""The P/D timeline: the plugin's patches stamp each event once per request, off costs nothing, the join per
X-Request-Id gives each gap, and a class missing a method is left unpatched."""

from __future__ import annotations

import json
from types import ModuleType, SimpleNamespace

import pytest

from hybridserve.core.chaos import timeline_gaps as report
from hybridserve.core.common import timeline_log
from hybridserve.core.common.contracts import TIMELINE_FILE_ENV
from hybridserve.core.vllm_plugin import timeline as timeline

RID = "0123456789abcdef0123456789abcdef"


@pytest.fixture
def timeline_file(tmp_path, monkeypatch):
    path = tmp_path / "timeline.jsonl"
    monkeypatch.setattr(timeline_log, "_fd", [])
    timeline_log.open_file(str(path))
    yield path


def _scheduler_module() -> ModuleType:
    class Scheduler:
        def add_request(self, request):
            self.req = request

        def schedule(self):
            return SimpleNamespace(num_scheduled_tokens={self.req.request_id: 1})

        def update_from_output(self, finish=None):
            out = SimpleNamespace(request_id=self.req.request_id, new_token_ids=[7], finish_reason=finish)
            return {0: SimpleNamespace(outputs=[out])}

        def _update_from_kv_xfer_finished(self, kv_connector_output):
            return None

    module = ModuleType("fake_scheduler")
    module.Scheduler = Scheduler
    return module


def _worker_module() -> ModuleType:
    class NixlPullConnectorWorker:
        def _read_blocks(self, read_spec, dst_engine_id, request_id, **kwargs):
            self.pending = {request_id: ["handle"]}

        def _pop_done_transfers(self, transfers):
            done = set(transfers)
            transfers.clear()
            return done

    module = ModuleType("fake_worker")
    module.NixlPullConnectorWorker = NixlPullConnectorWorker
    return module


def _events(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_scheduler_events_once_per_request(timeline_file):
    module = _scheduler_module()
    timeline.patch_scheduler(module)
    scheduler = module.Scheduler()
    request = SimpleNamespace(request_id=f"cmpl-{RID}-0-abcd", kv_transfer_params={"do_remote_prefill": True},
                              num_prompt_tokens=9)
    scheduler.add_request(request)
    scheduler._update_from_kv_xfer_finished(SimpleNamespace(finished_recving={request.request_id}))
    scheduler.schedule(), scheduler.schedule()  # the second step schedules it again: no second event
    scheduler.update_from_output(), scheduler.update_from_output(finish="length")
    names = [e["event"] for e in _events(timeline_file)]
    assert names == ["arrive", "recv_seen", "scheduled", "first_token", "finished"]
    assert _events(timeline_file)[0]["role"] == "decode"


def test_worker_events_post_and_done(timeline_file):
    module = _worker_module()
    timeline.patch_pull_worker(module)
    worker = module.NixlPullConnectorWorker()
    worker._read_blocks(read_spec=None, dst_engine_id="p", request_id="r1")
    assert worker._pop_done_transfers(worker.pending) == {"r1"}
    assert [(e["event"], e["req"]) for e in _events(timeline_file)] == [
        ("post_start", "r1"), ("posted", "r1"), ("nixl_done", "r1")]


def test_off_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(timeline_log, "_fd", [])
    timeline_log.emit("arrive", "x")  # no file open: nothing, no error
    assert timeline_log.path_from_env({}) is None
    assert timeline_log.path_from_env({TIMELINE_FILE_ENV: " /tmp/x "}) == "/tmp/x"


def test_class_without_a_method_stays_unpatched(timeline_file, caplog):
    module = ModuleType("old")

    class NixlPullConnectorWorker:
        def _read_blocks(self):
            return "original"

    module.NixlPullConnectorWorker = NixlPullConnectorWorker
    timeline.patch_pull_worker(module)
    assert NixlPullConnectorWorker._read_blocks(None) == "original"
    assert not getattr(NixlPullConnectorWorker, "_hybridserve_timeline", False)
    assert "_pop_done_transfers" in caplog.text


def test_breakdown_joins_roles_by_request_id(tmp_path):
    def line(t, pid, event, req, **extra):
        return json.dumps({"t": t, "pid": pid, "event": event, "req": req, **extra})

    lines = [line(0.000, 1, "hop1_start", RID), line(0.001, 2, "arrive", f"cmpl-{RID}-0-aa", role="prefill"),
             line(0.002, 2, "scheduled", f"cmpl-{RID}-0-aa"), line(0.102, 2, "first_token", f"cmpl-{RID}-0-aa"),
             line(0.110, 1, "hop1_end", RID), line(0.111, 1, "hop2_start", RID),
             line(0.115, 3, "arrive", f"cmpl-{RID}-0-bb", role="decode"), line(0.116, 3, "alloc", f"cmpl-{RID}-0-bb"),
             line(0.117, 4, "post_start", f"cmpl-{RID}-0-bb"), line(0.120, 4, "posted", f"cmpl-{RID}-0-bb"),
             line(0.150, 4, "nixl_done", f"cmpl-{RID}-0-bb"), line(0.151, 3, "recv_seen", f"cmpl-{RID}-0-bb"),
             line(0.152, 3, "scheduled", f"cmpl-{RID}-0-bb"), line(0.180, 3, "first_token", f"cmpl-{RID}-0-bb"),
             line(0.185, 1, "hop2_first_byte", RID), line(0.112, 1, "first_token_out", RID), "{cut"]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines))
    rows = {r["gap"]: r for r in report.breakdown(path)["gaps"]}
    assert rows["prefill: scheduled -> token"]["p50_ms"] == pytest.approx(100.0)
    assert rows["decode: posted -> NIXL done (poll)"]["p50_ms"] == pytest.approx(30.0)
    assert rows["decode: READ post"]["p50_ms"] == pytest.approx(3.0)
    assert rows["P/D total (hop 1 start -> first byte)"]["p50_ms"] == pytest.approx(185.0)
    assert rows["proxy: hop 1 start -> token 1 out"]["p50_ms"] == pytest.approx(112.0)  # a proxy event, no arrive
    assert report.breakdown(path, since=1.0)["requests"] == 0
