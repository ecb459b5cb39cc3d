"""xPyD against aggregated replicas behind the same front door, at equal resources, with plan's prediction beside each
row; feeds BENCHMARKS.md, "Served P/D" (benchmarks/DETAILS.md, "P/D against aggregated replicas at equal resources").

    flock /tmp/hs-servers.lock .venv/bin/python benchmarks/equal_resources.py cpu --out DIR   # this 2-core box
    python3 benchmarks/equal_resources.py call --set 1p1d --out $OUT    # H200 (benchmarks/h200.sh equal-resources)
    python3 benchmarks/equal_resources.py report --state DIR             # the table from what the calls gathered
    python3 benchmarks/equal_resources.py call --set 3 --dry-run         # topologies and commands, nothing started

Sets: 1p1d = 1P1D against 2 replicas; 3 = 2P1D and 1P2D against 3 replicas. Equal resources: on CPU each engine one
core (1P1D: prefill core 0, decode core 1; replicas: core 0 and core 1), one configuration at a time. On the H200
an emulation under MPS: every engine of a set gets 1/N of the SMs (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, launch's
`sm_percent`) and the same KV cache bytes (`--kv-cache-memory-bytes`: the memory share, and no engine sizes its cache
from memory a neighbour is taking); all configurations of a set are up at once and driven one at a time (an idle
engine takes no SMs); every configuration shares the GPU's memory bandwidth alike. Each engine starts as its own
`launch --role R --index I` (own process session), the proxy as `launch --role proxy`, both configurations behind
the project's proxy with `least_outstanding`, as users would run it.

A `call` is one device call: it starts the MPS daemon (`nvidia-cuda-mps-control -d`) unless one runs, the set's
deployments, measures the step profile (`hybridserve step-profile`: first call of a set; plan's rates for the sweep
come from it), runs the next cells of the sweep (workload x rate x configuration, the replicas once more as the A/A
control) until DEADLINE, then stops every deployment and quits the daemon it started: nothing outlives the call.
The machine keeps /tmp while it is warm: the state (STATE, default /tmp/hs-equal/SET) and the torch.compile, Triton
and FlashInfer caches, so the next call starts warm and goes on where this one stopped; call again until it prints
"sweep done". A new machine (the next session) goes on from an earlier call's $OUT with `--resume DIR` (carried):
the profile and the cells done are kept. Each cell is one `hybridserve bench` run (Poisson arrivals, seeded: every configuration gets the same
requests); goodput, TTFT and ITL per configuration with plan's prediction beside (core/sizing/compare.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CLI = [sys.executable, "-c", "from hybridserve.cli.app import main; main()"]
M60 = "/tmp/m60"
# name -> (prefill engines, decode engines, replicas)
SETS = {"1p1d": {"pd-1p1d": (1, 1, 0), "replicas-2": (0, 0, 2)},
        "3": {"pd-2p1d": (2, 1, 0), "pd-1p2d": (1, 2, 0), "replicas-3": (0, 0, 3)}}
# workloads: prompt and output tokens, requests per cell
WORKLOADS = {
    "long": {"input_len": "8000:32000", "output_len": "128:256", "num": 40},
    "chat": {"input_len": "500:2000", "output_len": "256:1024", "num": 60},
    # the 2-core CPU with the tiny model (context 2,048, 8 sequences an engine): the same shapes, scaled down
    "long-cpu": {"input_len": "1000:1800", "output_len": "8:16", "num": 60},
    "chat-cpu": {"input_len": "100:400", "output_len": "32:128", "num": 60},
}
# SLOs, one rule for every machine: SLO_SCALE times one unit's idle latency from the step profile (TTFT at the
# workload's longest prompt, a decode step at its longest context), 90 % of requests within both (DistServe)
SLO_SCALE = 5
RATE_FRACTIONS = {"cpu": (0.25, 0.5, 0.8, 1.0, 1.25), "cuda": (0.5, 0.8, 1.0, 1.25)}  # of plan's highest rate in
# SLO for the replicas (the H200's calls are short: no quarter-load cell)
MIN_REQUESTS = 20  # a cell sends min(the workload's, max(MIN_REQUESTS, rate x the machine's cell_s)) requests


def machine(args: argparse.Namespace) -> dict:
    if args.mode == "cpu":
        return {"device": "cpu", "model": str(ROOT / "profiles/tiny-qwen3.5"), "workloads": args.workloads or
                ["long-cpu", "chat-cpu"], "kv": None, "unit": "one CPU core", "limits": (8, 2048, 2048),
                "rates": args.rates, "cell_s": 60}
    from hybridserve.core.host.gpu_memory import gpu_name

    kv = os.environ.get("HS_EQ_KV", "12g" if args.set == "1p1d" else "5g")
    return {"device": "cuda", "model": args.model or M60, "workloads": args.workloads or ["long", "chat"], "kv": kv,
            "unit": f"{gpu_name(0) or 'GPU'}, {100 // units(args.set)} % of the SMs (MPS) and {kv} of KV cache",
            "limits": (1024, 8192, 34816), "rates": args.rates, "cell_s": 45}


def units(set_name: str) -> int:
    prefill, decode, replicas = next(iter(SETS[set_name].values()))
    return prefill + decode + replicas


def topology(name: str, shape: tuple[int, int, int], mach: dict, base: int) -> dict:
    """One configuration: engine i on core i (CPU) or on GPU 0 with 1/N of the SMs (CUDA); proxy at `base`."""
    prefill, decode, replicas = shape
    n = prefill + decode + replicas
    engine: dict = {}
    if mach["device"] == "cuda":
        engine = {"vllm_args": ["--kv-cache-memory-bytes", mach["kv"]], "max_model_len": mach["limits"][2]}

    def inst(i: int, port: int, side: bool) -> dict:
        where = ({"devices": [0], "sm_percent": 100 // n, "gpu_memory_utilization": round(0.9 / (3 * n), 3)}
                 if mach["device"] == "cuda" else {"devices": [i]})
        return {"port": port, **({"side_channel_port": port + 50} if side else {}), **where}

    roles = ([("prefill", prefill), ("decode", decode)] if replicas == 0 else [("replicas", replicas)])
    out = {"model": mach["model"], "device": mach["device"], "engine": engine,
           "proxy": {"port": base, "policy": "least_outstanding"}}
    i = 0
    for role, count in roles:
        out[role] = []
        for _ in range(count):
            out[role].append(inst(i, base + 100 * (i + 1), role != "replicas"))
            i += 1
    return out


def launch_commands(name: str, topo_path: Path, topo: dict, run_dir: Path) -> list[list[str]]:
    """Every engine its own `launch --role R --index I` (no start waves between sharers of GPU 0: the KV cache is
    fixed, nothing profiles free memory), then the proxy; on CPU one `launch --role all`."""
    common = ["--topology", str(topo_path), "--run-dir", str(run_dir / name), "--json", "--timeout", "900",
              "--restart", "never"]
    if topo["device"] == "cpu":
        return [[*CLI, "launch", "--role", "all", *common]]
    out = []
    for role, key in (("prefill", "prefill"), ("decode", "decode"), ("replica", "replicas")):
        out += [[*CLI, "launch", "--role", role, "--index", str(i), *common] for i in range(len(topo.get(key, [])))]
    return out + [[*CLI, "launch", "--role", "proxy", *common]]


class Mps:
    """The MPS control daemon for this call: started unless one runs, quit at the end only if started here."""

    def __init__(self, dry: bool) -> None:
        self.started, self.dry = False, dry

    def __enter__(self) -> "Mps":
        from hybridserve.core.host.mps_daemon import find_daemon

        if self.dry or find_daemon() is not None:
            return self
        done = subprocess.run(["nvidia-cuda-mps-control", "-d"], capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"nvidia-cuda-mps-control -d: exit {done.returncode}: {done.stderr.strip()}")
        self.started = True
        for _ in range(50):
            if find_daemon() is not None:
                break
            time.sleep(0.1)
        return self

    def __exit__(self, *_exc: object) -> None:
        if self.started:
            subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", text=True, capture_output=True)


class Deployments:
    """The configurations of a set, each from its own topology file, every launch in its own process session."""

    def __init__(self, args: argparse.Namespace, mach: dict, names: list[str]) -> None:
        self.args, self.mach, self.names = args, mach, names
        self.procs: list[subprocess.Popen] = []
        self.urls: dict[str, dict] = {}

    def plan(self, name: str, index: int) -> tuple[Path, dict, list[list[str]]]:
        shape = SETS[self.args.set][name]
        topo = topology(name, shape, self.mach, self.args.base_port + 1000 * index)
        path = self.args.state / f"{name}.yaml"
        return path, topo, launch_commands(name, path, topo, self.args.state / "runs")

    def start(self, only: list[str] | None = None) -> None:
        for index, name in enumerate(self.names):
            if only is not None and name not in only:
                continue
            path, topo, commands = self.plan(name, index)
            path.write_text(yaml.safe_dump(topo))
            engines = [f"http://127.0.0.1:{i['port']}" for k in ("prefill", "decode", "replicas")
                       for i in topo.get(k, [])]
            self.urls[name] = {"proxy": f"http://127.0.0.1:{topo['proxy']['port']}", "engines": engines}
            for argv in commands:
                log = open(self.args.state / f"launch-{name}-{len(self.procs)}.log", "w")
                self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                                   start_new_session=True, env={**os.environ, **CACHE_ENV}))

    def wait_healthy(self, deadline: float) -> dict[str, bool]:
        from hybridserve.core.supervise.health import is_healthy

        every = {u for info in self.urls.values() for u in [info["proxy"], *info["engines"]]}
        while time.time() < deadline:
            if all(is_healthy(u) for u in every):
                break
            if any(p.poll() is not None for p in self.procs):
                break  # a launch gave up (its log says why)
            time.sleep(2)
        return {name: all(is_healthy(u) for u in [i["proxy"], *i["engines"]]) for name, i in self.urls.items()}

    def stop(self) -> None:
        for proc in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGINT)  # launch stops its roles
            except ProcessLookupError:
                pass
        for proc in self.procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        self.procs = []


CACHE_ENV = {"TRITON_CACHE_DIR": "/tmp/hs-triton"}  # kept between the calls of a warm machine


def load_state(args: argparse.Namespace, mach: dict) -> dict:
    path = args.state / "state.json"
    if not path.is_file() and args.resume:  # a new machine: the profile and the cells done so far, carried back
        state = json.loads((args.resume / "equal_resources_state.json").read_text())
        if state.get("profile"):
            profile = args.state / Path(state["profile"]).name
            shutil.copy(args.resume / profile.name, profile)
            state["profile"] = str(profile)
        return state
    if path.is_file():
        return json.loads(path.read_text())
    return {"set": args.set, "device": mach["device"], "model": mach["model"], "unit": mach["unit"],
            "units": units(args.set), "workloads": mach["workloads"], "rates": {}, "cells": {}, "profile": None,
            "calls": []}


def save_state(args: argparse.Namespace, state: dict) -> None:
    tmp = args.state / "state.json.tmp"
    tmp.write_text(json.dumps(state, indent=1))
    tmp.replace(args.state / "state.json")


def run(argv: list[str], log: Path, timeout_s: float) -> int | None:
    try:
        with open(log, "w") as out:
            return subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, timeout=max(5.0, timeout_s)).returncode
    except subprocess.TimeoutExpired:
        return None


def measure_profile(args: argparse.Namespace, state: dict, mach: dict, urls: dict, deadline: float,
                    pd: str | None) -> None:
    """Steps on one replica (its neighbours idle); the transfer on the 1P1D (or first P/D) configuration; the load
    factor of every configuration up (its proxy, closed loop)."""
    seqs, tokens, context = mach["limits"]
    if mach["kv"]:  # launch caps each engine at the state blocks its KV cache holds (seqs_fit.py): the profile too
        from hybridserve.core.launch.seqs_fit import fixed_kv_blocks

        seqs = min(seqs, fixed_kv_blocks(mach["model"], mach["kv"]))
    path = args.state / f"profile-{args.set}.yaml"
    if mach["device"] == "cpu":
        grid = ["--prefill-lens", "64,256,512,1024,1536,1900", "--batches", "1,2,4,8", "--decode-lens", "128,1024",
                "--transfer-lens", "256,1024,1536", "--decode-output", "32"]
    else:
        grid = ["--prefill-lens", "1024,8192,16384,32000", "--batches", "1,8,32", "--decode-lens", "2048",
                "--transfer-lens", "1024,32000", "--decode-output", "64", "--repeats", "2"]  # about 3 minutes
    argv = [*CLI, "step-profile", "--model", mach["model"], "--out", str(path),
            "--device", mach["device"], "--unit", mach["unit"], "--max-num-seqs", str(seqs),
            "--max-num-batched-tokens", str(tokens), "--max-model-len", str(context), "--name",
            f"{'cpu-core' if mach['device'] == 'cpu' else 'h200-sm' + str(100 // units(args.set))}", *grid, "--json"]
    if pd:
        argv += ["--pd", pd]
    for name in SETS[args.set]:
        if name in urls and not state.get("calibrated", {}).get(name):
            argv += ["--calibrate", urls[name]["proxy"]]
    if state.get("profile"):  # the steps measured already: the transfer on top of them
        argv += ["--steps-from", state["profile"]]
    else:
        argv += ["--replica", next(info for name, info in urls.items() if name.startswith("replicas"))["engines"][0]]
    rc = run(argv, args.state / f"step_profile{'_transfer' if pd else ''}.json", deadline - time.time())
    if rc == 0:
        state["profile"] = str(path)
        state.setdefault("profile_runs", []).append({"pd": pd, "at": time.time()})
        state.setdefault("calibrated", {}).update({n: True for n in SETS[args.set] if n in urls})


def slo_of(profile, workload: dict) -> dict:  # noqa: ANN001 (StepProfile)
    """SLO_SCALE x the unit's idle TTFT at the longest prompt and its idle decode step at the longest context."""
    from hybridserve.core.bench.lengths import parse_length
    from hybridserve.core.sizing.step_fit import ttft_observation

    c, limits = profile.coefficients, profile.limits
    longest = parse_length(workload["input_len"], flag="input").max_tokens
    out = parse_length(workload["output_len"], flag="output").max_tokens
    features = ttft_observation(longest, limits.max_num_batched_tokens, 0.0).features
    ttft = sum(f * k for f, k in zip(features, (c.http_s, c.base_s, c.token_s, c.seq_s, c.attention_s)))
    itl = c.step_s(num_tokens=1, num_seqs=1, attention_pairs=longest + out)
    return {"ttft_s": round(SLO_SCALE * ttft, 4), "itl_s": round(SLO_SCALE * itl, 5)}


def choose_rates(state: dict, mach: dict) -> None:
    """Per workload: its SLO (slo_of), then fractions of plan's highest rate in SLO for the aggregated replicas (the
    baseline, whose load factor is measured first)."""
    from hybridserve.core.model.profiles import load_model
    from hybridserve.core.sizing.recommend import SizingRequest, size
    from hybridserve.core.sizing.step_profile import load_step_profile
    from hybridserve.core.sizing.workload import make_slo, make_workload

    profile = load_step_profile(state["profile"])
    for name in state["workloads"]:
        state.setdefault("slo", {}).setdefault(name, slo_of(profile, WORKLOADS[name]))
        if name in state["rates"]:
            continue
        if mach.get("rates"):
            state["rates"][name] = mach["rates"]
            continue
        w = WORKLOADS[name]
        sizing = size(SizingRequest(model=load_model(mach["model"]), profile=profile, num_units=state["units"],
                                    workload=make_workload(w["input_len"], w["output_len"], 1.0, num_requests=w["num"]),
                                    slo=make_slo(**state["slo"][name])))
        top = next(r.max_slo_rate for r in sizing.results if not r.candidate.is_pd) or 1.0  # the replicas'

        state["rates"][name] = [round(top * f, 3) for f in RATE_FRACTIONS[mach["device"]]]


def requests_of(workload: dict, rate: float, mach: dict) -> int:
    """A cell's requests: the workload's, fewer at low rates (a cell lasts about the machine's cell_s)."""
    return min(workload["num"], max(MIN_REQUESTS, round(rate * mach["cell_s"])))


def cells(state: dict, names: list[str]) -> list[tuple[str, float, str]]:
    """(workload, rate, target) in the order they run: per rate every configuration, the replicas' A/A last."""
    aa = [f"{n} (A/A)" for n in names if n.startswith("replicas")]
    return [(w, r, t) for w in state["workloads"] for r in state["rates"].get(w, []) for t in names + aa]


def bench_cell(args: argparse.Namespace, state: dict, mach: dict, cell: tuple[str, float, str], url: str,
               deadline: float) -> None:
    from hybridserve.core.sizing.compare import measured_stats
    from hybridserve.core.sizing.workload import make_slo

    workload, rate, target = cell
    w = WORKLOADS[workload]
    num = requests_of(w, rate, mach)
    key = f"{workload}|{rate}|{target}"
    out = args.state / f"bench_{workload}_{rate}_{target.split(' ')[0]}{'_aa' if '(A/A)' in target else ''}.json"
    argv = [*CLI, "bench", "--deployment", url, "--baseline", "none", "--model", mach["model"], "--device",
            mach["device"], "--input-len", w["input_len"], "--output-len", w["output_len"], "--num-requests",
            str(num), "--request-rate", str(rate), "--seed", "0", "--prompt-seed", str(int(rate * 1000)),
            "--timeout", str(int(max(60, deadline - time.time() - 20))), "--out", str(out)]
    started = time.time()
    rc = run(argv, out.with_suffix(".log"), deadline - time.time() - 10)
    entry = {"rc": rc, "file": str(out), "started": started, "seconds": round(time.time() - started, 1),
             "num_requests": num}
    if rc == 0:
        stats = measured_stats(json.loads(out.read_text()), make_slo(**state["slo"][workload]), state["units"])
        entry["measured"] = {k: getattr(stats, k) for k in ("goodput", "goodput_per_unit", "attainment",
                                                           "output_tokens_per_s", "ttft_p50_s", "ttft_p90_s",
                                                           "itl_p50_s", "itl_p90_s", "wall_s")}
    state["cells"][key] = entry


def sweep(args: argparse.Namespace, state: dict, mach: dict, urls: dict, deadline: float,
          only: list[str] | None = None) -> bool:
    """The cells not done yet whose target is up, until the deadline; True once every cell is done."""
    names = list(SETS[args.set])
    for cell in cells(state, names):
        workload, rate, target = cell
        key = f"{workload}|{rate}|{target}"
        base = target.split(" ")[0]
        if key in state["cells"] and state["cells"][key].get("rc") == 0:
            continue
        if only is not None and target not in only:
            continue
        need = requests_of(WORKLOADS[workload], rate, mach) / rate + 45
        if time.time() + need > deadline or base not in urls:
            continue
        bench_cell(args, state, mach, cell, urls[base]["proxy"], deadline)
        save_state(args, state)
    return all(state["cells"].get(f"{w}|{r}|{t}", {}).get("rc") == 0 for w, r, t in cells(state, names))


def report(state: dict) -> dict:
    """Per (workload, rate): each configuration measured and predicted, the A/A control, the winners."""
    from hybridserve.core.model.profiles import load_model
    from hybridserve.core.sizing.compare import Cell, predict_cell, winner
    from hybridserve.core.sizing.served_stats import ServedStats
    from hybridserve.core.sizing.step_profile import load_step_profile
    from hybridserve.core.sizing.workload import make_slo, make_workload

    profile = load_step_profile(state["profile"]) if state.get("profile") else None
    model = load_model(state["model"])
    rows = []
    for workload in state["workloads"]:
        w = WORKLOADS[workload]
        if workload not in state.get("slo", {}):
            continue
        slo = make_slo(**state["slo"][workload])
        for rate in state["rates"].get(workload, []):
            found, aa, sent = [], None, {}
            shapes = SETS[state["set"]]
            aa_shapes = [(f"{n} (A/A)", s) for n, s in shapes.items() if n.startswith("replicas")]
            for target, shape in [*shapes.items(), *aa_shapes]:
                entry = state["cells"].get(f"{workload}|{rate}|{target}", {})
                if "measured" not in entry:
                    continue
                kept = {k: v for k, v in entry["measured"].items() if k != "goodput_per_unit"}  # a property
                num = entry.get("num_requests", w["num"])  # the same requests (seed 0) as the cell sent
                measured = ServedStats(num_requests=num, requests_per_s=0.0, num_units=state["units"],
                                       attainment_target=slo.attainment, **kept)
                if target.endswith("(A/A)"):
                    aa = measured
                    continue
                work = make_workload(w["input_len"], w["output_len"], rate, num_requests=num)
                predicted = predict_cell(model, profile, shape, work, slo) if profile else None
                found.append(Cell(workload=workload, rate=rate, config=target, measured=measured, predicted=predicted))
                sent[target] = num
            if not found:
                continue
            replicas = next((c for c in found if c.config.startswith("replicas")), None)
            spread = (abs(aa.goodput - replicas.measured.goodput) / max(replicas.measured.goodput, 1e-9)
                      if aa and replicas else 0.0)
            rows.append({"workload": workload, "rate": rate, "slo": {"ttft_s": slo.ttft_s, "itl_s": slo.itl_s},
                         "aa_goodput_spread": round(spread, 3),
                         "aa": _stats(aa) if aa else None,
                         "winner_measured": winner(found, predicted=False, aa_spread=spread),
                         "winner_predicted": winner(found, predicted=True, aa_spread=spread),
                         "configs": {c.config: {"measured": _stats(c.measured), "predicted": _stats(c.predicted),
                                                "goodput_error": c.goodput_error, "num_requests": sent[c.config],
                                                "shape": list(SETS[state["set"]][c.config])} for c in found}})
    return {"set": state["set"], "device": state["device"], "unit": state["unit"], "units": state["units"],
            "workloads": {w: WORKLOADS[w] for w in state["workloads"]},
            "model": state["model"], "profile": state.get("profile"), "rows": rows}


def _stats(stats) -> dict | None:  # noqa: ANN001 (ServedStats | None)
    if stats is None:
        return None
    return {"goodput_per_unit": round(stats.goodput_per_unit, 4), "goodput": round(stats.goodput, 4),
            "attainment": round(stats.attainment, 3), "output_tokens_per_s": round(stats.output_tokens_per_s, 1),
            "ttft_p90_s": round(stats.ttft_p90_s, 4),
            "itl_p90_s": None if stats.itl_p90_s is None else round(stats.itl_p90_s, 5)}


def render(data: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"equal resources ({data['device']}, {data['units']} x {data['unit']}): goodput per unit "
                        "measured (plan), TTFT p90 / ITL p90 ms, output tok/s; A/A = the replicas again")
    configs = sorted({c for row in data["rows"] for c in row["configs"]})
    for column in ("workload", "rate/s", *configs, "A/A goodput", "winner (plan)"):
        table.add_column(column, justify="left" if column in ("workload", "winner (plan)") else "right")
    for row in data["rows"]:
        cells = []
        for config in configs:
            c = row["configs"].get(config)
            if c is None:
                cells.append("-")
                continue
            m, p = c["measured"], c["predicted"]
            itl = "-" if m["itl_p90_s"] is None else f"{m['itl_p90_s'] * 1e3:.1f}"
            cells.append(f"{m['goodput_per_unit']:.2f} ({p['goodput_per_unit']:.2f})\n" if p else
                         f"{m['goodput_per_unit']:.2f}\n")
            cells[-1] += f"{m['ttft_p90_s'] * 1e3:,.0f} / {itl}\n{m['output_tokens_per_s']:,.0f}"
        aa = row["aa"]
        table.add_row(row["workload"], f"{row['rate']:g}", *cells,
                      f"{aa['goodput_per_unit']:.2f} ({row['aa_goodput_spread']:.0%})" if aa else "-",
                      f"{row['winner_measured'] or 'tie'} ({row['winner_predicted'] or 'tie'})")
    Console(width=200).print(table)


def call(args: argparse.Namespace) -> None:
    """One device call (H200): MPS daemon, every deployment of the set, profile once, cells until the deadline."""
    mach = machine(args)
    names = list(SETS[args.set])
    deployments = Deployments(args, mach, names)
    if args.dry_run:
        for index, name in enumerate(names):
            path, topo, commands = deployments.plan(name, index)
            starts = "".join(f"start: {' '.join(c[3:])}\n" for c in commands)
            print(f"# {name}: {path}\n{yaml.safe_dump(topo)}{starts}")
        print("mps: nvidia-cuda-mps-control -d (unless one runs); at the end: echo quit | nvidia-cuda-mps-control")
        return
    args.state.mkdir(parents=True, exist_ok=True)
    state = load_state(args, mach)
    done, began = False, time.time()
    with Mps(args.dry_run):
        # the replicas first, alone: a cold machine compiles once (torch.compile's cache), the others then reuse it
        first = next(n for n in names if n.startswith("replicas"))
        deployments.start(only=[first])
        try:
            deployments.wait_healthy(args.deadline - 150)
            deployments.start(only=[n for n in names if n != first])
            healthy = deployments.wait_healthy(args.deadline - 90)
            state["calls"].append({"started": began, "healthy": healthy, "healthy_s": round(time.time() - began)})
            save_state(args, state)
            if not all(healthy.values()):
                print(f"not every deployment healthy after {time.time() - began:.0f} s ({healthy}): the caches are "
                      "warmer now, call again")
            else:
                done = _measure(args, state, mach, deployments.urls)
        finally:
            deployments.stop()
    save_state(args, state)
    finish(args, state, done)


def _measure(args: argparse.Namespace, state: dict, mach: dict, urls: dict) -> bool:
    """The profile once (2-3 minutes), then as many cells as the call has time for."""
    if not state.get("profile"):
        if args.deadline - time.time() < 200:
            print("no time left for the step profile in this call: call again")
            return False
        pd = next(u["proxy"] for n, u in urls.items() if n.startswith("pd"))
        measure_profile(args, state, mach, urls, args.deadline - 60, pd)
    if state.get("profile"):
        choose_rates(state, mach)
    save_state(args, state)
    return sweep(args, state, mach, urls, args.deadline - 60)


def cpu(args: argparse.Namespace) -> None:
    """This box: one configuration at a time (each engine its own core), the replicas again as the A/A control."""
    mach = machine(args)
    args.state.mkdir(parents=True, exist_ok=True)
    state = load_state(args, mach)
    replicas, pd = "replicas-2", "pd-1p1d"
    for target, name in ((replicas, replicas), (pd, pd), (f"{replicas} (A/A)", replicas)):
        deployments = Deployments(args, mach, list(SETS[args.set]))
        deployments.start(only=[name])
        try:
            healthy = deployments.wait_healthy(time.time() + 300)
            state["calls"].append({"started": time.time(), "healthy": healthy, "target": target})
            if not healthy.get(name):
                continue
            if target == replicas and not state.get("profile"):
                measure_profile(args, state, mach, deployments.urls, args.deadline, None)
            if target == pd and not any(r.get("pd") for r in state.get("profile_runs", [])):
                measure_profile(args, state, mach, deployments.urls, args.deadline, deployments.urls[pd]["proxy"])
            if state.get("profile"):
                choose_rates(state, mach)
            save_state(args, state)
            sweep(args, state, mach, deployments.urls, args.deadline, only=[target])
        finally:
            deployments.stop()
        save_state(args, state)
    finish(args, state, True)


def finish(args: argparse.Namespace, state: dict, done: bool) -> None:
    data = report(state)
    out = args.out or args.state
    out.mkdir(parents=True, exist_ok=True)
    (out / "equal_resources.json").write_text(json.dumps(data, indent=1))
    if out != args.state:
        shutil.copy(args.state / "state.json", out / "equal_resources_state.json")
        if state.get("profile"):
            shutil.copy(state["profile"], out / Path(state["profile"]).name)
    render(data)
    print("sweep done" if done else "sweep not done: call again")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=("cpu", "call", "report"))
    p.add_argument("--set", choices=tuple(SETS), default="1p1d")
    p.add_argument("--out", type=Path, default=os.environ.get("OUT"))
    p.add_argument("--state", type=Path, default=None, help="state folder (default /tmp/hs-equal/SET)")
    p.add_argument("--model", default=None, help="model folder (default: CPU the tiny model, CUDA /tmp/m60)")
    p.add_argument("--workloads", nargs="+", choices=tuple(WORKLOADS), default=None)
    p.add_argument("--base-port", type=int, default=int(os.environ.get("HS_EQ_BASE_PORT", "20000")))
    p.add_argument("--rates", nargs="+", type=float, default=None, help="the sweep's rates (default: fractions of "
                   "plan's highest rate in SLO, from the profile measured first)")
    p.add_argument("--num-requests", type=int, default=None, help="requests per cell (default: the workload's)")
    p.add_argument("--resume", type=Path, default=None, help="a folder with an earlier call's $OUT files "
                   "(equal_resources_state.json, profile-SET.yaml): a new machine goes on from there")
    p.add_argument("--dry-run", action="store_true", help="print the topologies and launch commands only")
    a = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `timeout` at the deadline: stop what was started
    a.state = a.state or Path(f"/tmp/hs-equal/{a.set}")
    a.deadline = float(os.environ["DEADLINE"]) - 10 if os.environ.get("DEADLINE") else time.time() + 3 * 3600
    if a.num_requests:
        for w in WORKLOADS.values():
            w["num"] = a.num_requests
    if a.mode == "report":
        data = report(json.loads((a.state / "state.json").read_text()))
        render(data)
        print(json.dumps(data, indent=1)) if a.out is None else (a.out / "equal_resources.json").write_text(
            json.dumps(data, indent=1))
        return
    {"cpu": cpu, "call": call}[a.mode](a)


if __name__ == "__main__":
    main()
