"""Session set-up shared by all tests.

Triton decides at import time whether its own library (tl.zeros, ...) runs in the interpreter. On a machine
without a GPU the fused Triton kernel can only be checked in the interpreter, so import triton here, before any
test or vLLM import does, with TRITON_INTERPRET=1, then take the variable away again so that the vLLM servers the
launch and validate tests start do not inherit it. The fused-kernel tests set it themselves while they run.
"""

import importlib.util
import os


def _import_triton_for_the_interpreter() -> None:
    if os.environ.get("TRITON_INTERPRET") is not None or importlib.util.find_spec("triton") is None:
        return
    try:
        import torch

        if torch.cuda.is_available():
            return
    except ImportError:
        return
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    finally:
        del os.environ["TRITON_INTERPRET"]


_import_triton_for_the_interpreter()
