"""The built wheel, installed into a fresh venv as a user would (CPU torch first, then `<wheel>[cpu]`), gives the
`nixl._api` import vLLM's NixlConnector does (vllm/distributed/nixl_utils.py) and runs `transfer bench`.

Kept fast by uv and its download cache (the Makefile's installer; ~/.cache/uv, which CI may keep), linking files
from the cache instead of copying them, and by taking CPU torch from pip's configured find-links (the local wheel).
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.nixl_agents,  # starts NIXL agents, no vLLM server (Makefile side stream)
              pytest.mark.xdist_group("nixl_agents")]

ROOT = Path(__file__).resolve().parents[1]
UV = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")


def _find_links() -> list[str]:
    """pip's find-links (PIP_FIND_LINKS or pip's configuration): where CPU torch lies on this machine."""
    links = os.environ.get("PIP_FIND_LINKS", "")
    if not links:
        out = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.find-links"],
                             capture_output=True, text=True)
        links = out.stdout.strip() if out.returncode == 0 else ""
    return [arg for link in links.split() for arg in ("--find-links", link)]


def _run(cmd, **kw):
    done = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert done.returncode == 0, f"{cmd[:4]} exited {done.returncode}: {done.stderr[-2000:]}"
    return done


@pytest.mark.skipif(UV is None, reason="uv not installed (the Makefile installs it into .venv)")
def test_wheel_in_fresh_venv_imports_nixl_and_runs_transfer_bench(tmp_path):
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "dist"), str(ROOT)])
    (wheel,) = (tmp_path / "dist").glob("hybridserve-*.whl")
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    uv = [UV, "pip", "install", "-q", "--python", str(python), "--link-mode", "hardlink", *_find_links()]
    _run([*uv, "torch==2.13.0+cpu"])  # CPU torch first (docs/install.md); only the find-links hold +cpu
    _run([*uv, f"{wheel}[cpu]"])

    api = _run([str(python), "-c", "import importlib; m = importlib.import_module('nixl._api'); "
                "print(m.nixl_agent.__module__)"], cwd=tmp_path)
    assert api.stdout.strip().startswith("nixl_cu13"), api.stdout  # CPU torch: the meta package loads nixl_cu13

    bench = _run([str(venv / "bin" / "hybridserve"), "transfer", "bench", "-m", "qwen3.5-0.8b", "--prompt-len", "1024",
                  "--scheme", "vllm", "--requests", "1", "--json"], cwd=tmp_path, timeout=300)
    rows = json.loads(bench.stdout)["rows"]
    assert rows and all(r["is_exact"] and r["num_bytes"] > 0 and r["transfer_ms"] > 0 for r in rows), rows
