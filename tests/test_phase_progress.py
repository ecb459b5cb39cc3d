"""cli/phase_progress.py: bench's and validate's progress bars, and a signal turned into one line."""

from __future__ import annotations

import os
import signal

import pytest

from hybridserve.cli.phase_progress import run_with_phase_progress
from hybridserve.core.common.errors import CouldNotRunError


def test_the_work_gets_a_progress_callback_and_its_result_comes_back():
    seen = []

    def work(on_progress):  # noqa: ANN001, ANN202
        for done in range(3):
            on_progress("baseline", done, 2)
            seen.append(done)
        on_progress("candidate", 1, 1)
        return "report"

    assert run_with_phase_progress(work, before="the verdict") == "report"
    assert seen == [0, 1, 2]


def test_sigterm_during_the_work_is_one_error_naming_the_signal_and_what_was_not_reached():
    unwound = []

    def work(on_progress):  # noqa: ANN001, ANN202
        try:
            on_progress("baseline", 0, 4)
            os.kill(os.getpid(), signal.SIGTERM)
            raise AssertionError("the signal did not stop the work")
        finally:
            unwound.append(True)  # a started server's stop runs here

    with pytest.raises(CouldNotRunError, match=r"^stopped by SIGTERM before the results$"):
        run_with_phase_progress(work, before="the results")
    assert unwound == [True]
