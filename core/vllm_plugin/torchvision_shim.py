"""Make `import torchvision` work beside CPU torch when the installed torchvision is a CUDA build.

PyPI's torchvision is built against CUDA torch; beside `torch==2.13.0+cpu` its C extension (`_C.so`) fails to
load, `extension._has_ops()` is False, and `_meta_registrations.py` then dies on
`@torch.library.register_fake("torchvision::nms")` ("operator torchvision::nms does not exist"). vLLM's Qwen3.5
code imports torchvision (via transformers' Qwen2-VL image processor), so the model cannot even be inspected.

The fix edits no installed file: when the extension cannot load, define the two operator schemas that module
registers fakes for (`nms`, `qnms`) in a torch.library fragment, just before torchvision is first imported. Calling them would still fail (no kernel),
which is the truth: the ops are not available; only the import succeeds. Where the extension loads (a CPU or
matching CUDA build), nothing is done.

vLLM imports torchvision at `import vllm.config`, before it loads any plugin, in the API server and in its
model-inspection subprocess; so `launch` also puts startup/sitecustomize.py on the servers' PYTHONPATH, which
arms this shim at interpreter start in every process of the server.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
from pathlib import Path

from hybridserve.core.vllm_plugin.import_hooks import before_import

logger = logging.getLogger(__name__)

# Schemas as torchvision declares them (csrc/ops/nms.cpp): same argument names and types.
_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
_fragment = None  # keeps the library fragment alive for the life of the process


def needs_shim() -> bool:
    """True when torchvision is installed, not yet imported, and its C extension cannot load here."""
    if "torchvision" in sys.modules:
        return False
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return False
    libs = sorted(Path(next(iter(spec.submodule_search_locations))).glob("_C*.so"))
    if not libs:
        return True
    import torch

    try:
        torch.ops.load_library(str(libs[0]))
    except (ImportError, OSError):
        return True
    return False


def install() -> bool:
    """Define the missing schemas if needed; returns whether the shim was applied. Safe to call twice."""
    global _fragment
    if _fragment is not None or not needs_shim():
        return False
    import torch

    fragment = torch.library.Library("torchvision", "FRAGMENT")
    for schema in _SCHEMAS:
        fragment.define(schema)
    _fragment = fragment
    logger.info("hybridserve: torchvision C ops unavailable here; defined nms/qnms schemas so it imports")
    return True


def install_lazy() -> None:
    """Apply the shim just before the first `import torchvision` of this process (costs nothing otherwise)."""
    before_import("torchvision", install)
