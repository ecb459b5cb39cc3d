"""Results on stdout stay parseable when a kernel library prints there (TileLang's compile log did, on the H200)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("torch")

# verify's run, with a stand-in "library" that writes to fd 1 from C-like code (os.write) and from Python (print)
NOISY_VERIFY = """
import os, sys
import hybridserve.kernels.verify as verify
real = verify.run_verify
def noisy(*args, **kwargs):
    os.write(1, b"TileLang begins to compile kernel\\n")
    print("a library's print", flush=True)
    return real(*args, **kwargs)
verify.run_verify = noisy
from hybridserve.cli.app import main
main()
"""


def test_verify_json_stays_clean_while_a_library_prints_to_stdout():
    done = subprocess.run([sys.executable, "-c", NOISY_VERIFY, "verify", "--backend", "torch", "--model",
                           "qwen3.5-0.8b", "--tp", "1", "--head-dim", "16", "--long-len", "70", "--json"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)  # nothing but the report
    assert report["ok"] is True and report["results"]
    assert "TileLang begins to compile kernel" in done.stderr and "a library's print" in done.stderr


def test_stdout_is_restored_after_the_block():
    code = ("import os; from hybridserve.cli.console import library_output_to_stderr\n"
            "with library_output_to_stderr():\n    os.write(1, b'inside\\n'); print('inside too', flush=True)\n"
            "print('result')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout == "result\n" and "inside\ninside too\n" in done.stderr
