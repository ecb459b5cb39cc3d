"""UCX for same-host VRAM: the environment launch and transfer bench set, and which transport UCX's own protocol
report says a transfer used, read from logs recorded on the H200 (tests/data, 2026-12-01):
- ucx_h200_cuda_ipc.log: `transfer bench --memory vram` rank processes with UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y;
- ucx_h200_tcp_fallback.log: the same with UCX_CUDA_IPC_ENABLE_GET_ZCOPY=n (READs over TCP loopback);
- vllm026_decode_h200.log: decode server log of `launch --role all --device cuda` (vLLM 0.26, NixlConnector).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from hybridserve.core.common import ucx
from hybridserve.core.common.ucx import Transport, fallback_message, parse_proto_info, rma_transport
from hybridserve.core.supervise.transport_watch import TransportWatch
from hybridserve.core.vllm_plugin.nixl_results import failed_recving, finished_recving, results_method

DATA = Path(__file__).parent / "data"
GOOD, FALLBACK, DECODE = (DATA / n for n in ("ucx_h200_cuda_ipc.log", "ucx_h200_tcp_fallback.log",
                                             "vllm026_decode_h200.log"))


def test_cuda_ipc_env_enables_get_zcopy_and_the_report():
    assert ucx.cuda_ipc_env() == {"UCX_CUDA_IPC_ENABLE_GET_ZCOPY": "y", "UCX_PROTO_INFO": "y"}
    assert ucx.cuda_ipc_env(with_report=False) == {"UCX_CUDA_IPC_ENABLE_GET_ZCOPY": "y"}
    assert ucx.cuda_ipc_env(with_report=False, is_reader=True) == {"UCX_CUDA_IPC_ENABLE_GET_ZCOPY": "y",
                                                                   "UCX_CUDA_IPC_CACHE": "n"}


def test_an_operators_own_setting_wins():
    merged = ucx.merged_env({"UCX_CUDA_IPC_ENABLE_GET_ZCOPY": "n", "PATH": "/bin"}, ucx.cuda_ipc_env())
    assert merged == {"UCX_CUDA_IPC_ENABLE_GET_ZCOPY": "n", "UCX_PROTO_INFO": "y"}


@pytest.mark.parametrize("log, transport", [(GOOD, Transport.CUDA_IPC), (FALLBACK, Transport.TCP),
                                            (DECODE, Transport.CUDA_IPC)], ids=["get-zcopy", "fallback", "vllm"])
def test_gpu_to_gpu_read_transport_from_the_recorded_report(log, transport):
    tables = parse_proto_info(log.read_text())
    reads = [t for t in tables if t.operation == "read" and t.memory == "cuda"]
    assert reads and reads[0].memories == ("cuda", "cuda")
    assert rma_transport(tables, memory="cuda", operation="read") is transport


def test_tcp_fallback_is_named_and_a_healthy_log_is_not():
    message = fallback_message("decode-0", parse_proto_info(FALLBACK.read_text()))
    assert message is not None and message.startswith("decode-0: UCX moves GPU memory over TCP")
    assert "UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y" in message and "\n" not in message
    # the healthy logs hold a host->GPU write that UCX emulates over TCP: not a data path, no warning
    for log in (GOOD, DECODE):
        tables = parse_proto_info(log.read_text())
        assert any(t.memories == ("host", "cuda") and t.transport is Transport.TCP for t in tables)
        assert fallback_message("decode-0", tables) is None


def test_dram_tables_and_other_lines_parse_too():
    tables = parse_proto_info(GOOD.read_text())
    host = [t for t in tables if t.is_rma and t.memory == "host"]
    assert {t.transport for t in host} >= {Transport.CMA}
    assert all(not t.is_rma for t in tables if t.header.startswith("active message"))
    assert parse_proto_info("INFO vLLM started\n| not | a table |\n") == []


def test_launch_watch_warns_once_per_log_when_it_sees_a_fallback(tmp_path):
    good, bad = tmp_path / "prefill-0.log", tmp_path / "decode-0.log"
    good.write_text(DECODE.read_text())
    lines = FALLBACK.read_text().splitlines(keepends=True)
    bad.write_text("".join(lines[: len(lines) // 3]))  # the server is still writing its report
    warnings = []
    with TransportWatch({"prefill-0": good, "decode-0": bad}, warn=warnings.append, period_s=0.05) as watch:
        with bad.open("a") as log:
            log.write("".join(lines[len(lines) // 3:]))
        time.sleep(0.3)
    assert watch.warned == {"decode-0"}
    assert len(warnings) == 1 and warnings[0].startswith("decode-0: UCX moves GPU memory over TCP")


class _New:
    def get_transfer_results(self):  # vLLM 0.32
        return None


class _Old:
    def get_finished(self):  # vLLM 0.26
        return set(), {"r1"}


def test_plugin_wraps_the_step_results_call_each_version_has():
    class Out:
        finished_recving, failed_recving = {"a", "b"}, {"b"}

    assert results_method(_New) == "get_transfer_results" and results_method(_Old) == "get_finished"
    assert finished_recving(Out()) == {"a", "b"} and failed_recving(Out()) == {"b"}
    assert finished_recving((set(), {"r1"})) == {"r1"} and failed_recving((set(), {"r1"})) == set()


def test_transfer_log_patch_works_on_a_026_style_worker(caplog):
    import types

    from hybridserve.core.vllm_plugin import transfer_log

    class Worker:
        kv_cache_config = None

        def _read_blocks_for_req(self, req_id, meta):
            return None

        def get_finished(self):
            return set(), {"req-1"}

    transfer_log.patch_worker_module(types.SimpleNamespace(NixlPullConnectorWorker=Worker))
    worker = Worker()
    worker._read_blocks_for_req("req-1", types.SimpleNamespace(local_block_ids=([1, 2], [3])))
    with caplog.at_level("INFO"):
        assert worker.get_finished() == (set(), {"req-1"})
    assert "NIXL received request req-1: group 3 block(s) in 2 group(s)" in caplog.text
