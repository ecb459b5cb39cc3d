"""What the project's decode replica adds on Ray Serve, against Ray's stock path (issue 41, point 2), on CPU:
BENCHMARKS.md, "On Ray Serve, CPU".

Three deployments of the same plan, one after the other, on this machine (2 cores: prefill core 0, decode core 1):
- `ours`: launch --engine ray (first token from prefill, prefill failover on);
- `stock`: launch --engine ray --first-token decode --no-failover (Ray's PDDecodeServer as shipped);
- `launch`: launch's own P/D (--role all, its proxy), the same engines without Ray, for scale.
For each: idle TTFT (hybridserve bench: one request at a time, streamed, 1,024-token prompts, 16 output tokens), then,
on the Ray ones, a kill under load: 16 requests 4 at a time, prefill's engine SIGKILLed after the 3rd answer,
each request's status counted, and how long Serve took to bring prefill back.

    flock /tmp/hs-servers.lock .venv/bin/python benchmarks/ray_pd_cpu.py --out benchmarks/results/ray_pd_cpu.json

About 9 minutes. Every deployment is stopped before the next starts, and at the end whatever happens.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

from hybridserve.core.launch.topology import TINY_MODEL_DIR

HB = [sys.executable, "-c", "from hybridserve.cli.app import main; main()"]
URL = "http://127.0.0.1:8000"
PROMPT = [(7 * i + 3) % 1000 + 3 for i in range(300)]
MODES = {"ours": ["--engine", "ray"], "stock": ["--engine", "ray", "--first-token", "decode", "--no-failover"],
         "launch": []}


def start(mode: str, tmp: Path) -> subprocess.Popen:
    out, err = open(tmp / f"{mode}.out", "w"), open(tmp / f"{mode}.err", "w")
    popen = subprocess.Popen([*HB, "launch", *MODES[mode], "--ray-health-check-s", "2", "--json", "--run-dir",
                              str(tmp / "runs"), "--timeout", "500"] if mode != "launch" else
                             [*HB, "launch", "--role", "all", "--json", "--run-dir", str(tmp / "runs")],
                             stdout=out, stderr=err, start_new_session=True)
    deadline = time.monotonic() + 560
    while time.monotonic() < deadline:
        if (tmp / f"{mode}.out").read_text().strip().endswith("}"):
            return popen
        if popen.poll() is not None:
            raise RuntimeError(f"{mode}: launch exited {popen.returncode}: {(tmp / f'{mode}.err').read_text()[-2000:]}")
        time.sleep(1)
    raise RuntimeError(f"{mode}: not serving in time")


def stop(popen: subprocess.Popen) -> None:
    if popen.poll() is None:
        os.killpg(popen.pid, signal.SIGTERM)
        try:
            popen.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(popen.pid, signal.SIGKILL)
            popen.wait()


def idle_ttft(tmp: Path, mode: str) -> dict:
    out = tmp / f"{mode}-bench.json"
    done = subprocess.run([*HB, "bench", "--deployment", URL, "--baseline", "none", "--input-len", "1024",
                           "--output-len", "16", "--num-requests", "8", "--model", str(TINY_MODEL_DIR),
                           "--served-model", TINY_MODEL_DIR.name, "--out", str(out), "--json"], capture_output=True,
                          text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{mode}: bench exited {done.returncode}: {done.stderr[-2000:]}")
    target = json.loads(out.read_text())["targets"][0]["phases"][0]["client"]
    return {"ttft_s": target["ttft_s"], "e2e_s": target.get("e2e_s"), "num_ok": target.get("num_ok")}


def engine_pids(launcher: subprocess.Popen) -> list[int]:
    """Prefill's engine: the EngineCore under the replica whose log says prefill (Ray: a descendant of the head)."""
    found = []
    for proc in psutil.Process(launcher.pid).children(recursive=True):
        try:
            if "EngineCore" in proc.name() or "EngineCore" in " ".join(proc.cmdline()):
                env = proc.environ()
                if env.get("VLLM_CPU_OMP_THREADS_BIND") == "0":  # prefill's core
                    found.append(proc.pid)
        except psutil.Error:
            continue
    return found


def kill_under_load(launcher: subprocess.Popen, tmp: Path, mode: str) -> dict:
    pids = engine_pids(launcher)
    body = dict(model="tiny-qwen3.5", prompt=PROMPT, max_tokens=16, temperature=0.0, ignore_eos=True)
    done: list[tuple[int, object, float]] = []

    def one(i: int) -> None:
        t0 = time.monotonic()
        try:
            status = httpx.post(f"{URL}/v1/completions", json=body, timeout=120).status_code
        except httpx.HTTPError as exc:
            status = type(exc).__name__
        done.append((i, status, round(time.monotonic() - t0, 2)))

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(one, i) for i in range(16)]
        while len(done) < 3:
            time.sleep(0.1)
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        concurrent.futures.wait(futures)
    outcomes: dict[str, int] = {}
    for _, status, _ in done:
        outcomes[str(status)] = outcomes.get(str(status), 0) + 1
    back = None
    while time.monotonic() - killed_at < 400:
        now = engine_pids(launcher)
        if now and now != pids:
            back = round(time.monotonic() - killed_at, 1)
            break
        time.sleep(1)
    return {"killed_pids": pids, "outcomes": outcomes, "requests": sorted(done), "new_engine_after_s": back}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--modes", nargs="+", default=list(MODES))
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ray-pd-"))
    results = {}
    for mode in args.modes:
        launcher = start(mode, tmp)
        try:
            results[mode] = {"idle": idle_ttft(tmp, mode)}
            if mode != "launch":
                results[mode]["kill"] = kill_under_load(launcher, tmp, mode)
        finally:
            stop(launcher)
        print(json.dumps({mode: results[mode]}), flush=True)
    args.out.write_text(json.dumps({"run_folder": str(tmp), "results": results}, indent=2))


if __name__ == "__main__":
    main()
