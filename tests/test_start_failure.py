"""An engine that stops before it is healthy is reported by its root error line, not by its log's last lines."""

from __future__ import annotations

import pytest

from hybridserve.core.common.errors import CouldNotRunError
from hybridserve.core.supervise.health import wait_healthy
from hybridserve.core.supervise.process import start_role
from hybridserve.core.supervise.start_failure import HELD_BY_PEER, root_error, start_failure
from test_launch_process import _command

# the shape of a failed vLLM start on a GPU whose memory a NIXL peer still held (H200, 2026-12-04): the engine core's
# error, its traceback, then the API server's own error and NCCL's exit warning
FAILED_START = """\
(EngineCore pid=5358) ERROR 12-04 02:23:26 [core.py:1330] EngineCore failed to start.
(EngineCore pid=5358) ERROR 12-04 02:23:26 [core.py:1330]   File "vllm/v1/worker/utils.py", line 435, in request_memory
(EngineCore pid=5358) ERROR 12-04 02:23:26 [core.py:1330] ValueError: Free memory on device cuda:0 (17.98/139.8 GiB) \
on startup is less than desired GPU memory utilization (0.45, 62.91 GiB). Decrease GPU memory utilization or reduce \
GPU memory used by other processes.
(EngineCore pid=5358) Process EngineCore:
(EngineCore pid=5358) ValueError: Free memory on device cuda:0 (17.98/139.8 GiB) on startup is less than desired \
GPU memory utilization (0.45, 62.91 GiB). Decrease GPU memory utilization or reduce GPU memory used by other \
processes.
(APIServer pid=5287) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
[rank0]:[W1204 02:23:27.276542958 ProcessGroupNCCL.cpp:1575] Warning: WARNING: destroy_process_group() was not called
"""


def test_the_root_cause_is_the_engine_cores_error_not_the_api_servers(tmp_path):
    log = tmp_path / "prefill-0.log"
    log.write_text(FAILED_START)
    assert root_error(log).startswith("ValueError: Free memory on device cuda:0 (17.98/139.8 GiB)")
    why = start_failure(log)
    assert why.startswith("vLLM: cuda:0 had 17.98 of 139.8 GiB free, less than this engine's share (0.45, 62.91 GiB)")
    assert why.endswith(HELD_BY_PEER) and "\n" not in why


@pytest.mark.parametrize("text, expected", [
    ("INFO starting\n(APIServer pid=1) OSError: [Errno 98] Address already in use\n",
     "vLLM: OSError: [Errno 98] Address already in use"),
    ("INFO starting\nWARNING nothing failed here\n", None),
    ("(APIServer pid=2) RuntimeError: Engine core initialization failed. See root cause above.\n", None),
])
def test_other_errors_are_named_as_they_are_and_a_log_without_one_says_nothing(tmp_path, text, expected):
    log = tmp_path / "decode-0.log"
    log.write_text(text)
    assert start_failure(log) == expected
    assert start_failure(tmp_path / "absent.log") is None


def test_launch_names_the_root_cause_of_a_start_that_failed(tmp_path):
    script = f"import sys; sys.stdout.write({FAILED_START!r}); sys.exit(1)"
    role = start_role(_command("prefill-0", script), tmp_path)
    with pytest.raises(CouldNotRunError, match=r"prefill-0 exited with code 1 before it was healthy; .* vLLM: "
                                               r"cuda:0 had 17\.98 of 139\.8 GiB free") as caught:
        wait_healthy([role], timeout_s=30)
    assert "destroy_process_group" not in str(caught.value)


def test_an_earlier_runs_error_in_the_same_log_is_not_this_starts(tmp_path):
    """A restart appends to its role's log: the error of the run before it must not be named as this start's."""
    log = tmp_path / "prefill-0.log"
    log.write_text(FAILED_START)
    start = log.stat().st_size
    with open(log, "a") as out:
        out.write("INFO starting again\nKilled\n")
    assert start_failure(log).startswith("vLLM: cuda:0 had 17.98")  # the whole log
    assert start_failure(log, start) is None  # this start's lines name no error
    with open(log, "a") as out:
        out.write("(EngineCore pid=7) ValueError: bad config\n")
    assert start_failure(log, start) == "vLLM: ValueError: bad config"
