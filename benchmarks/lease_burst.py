"""A burst whose decode queue outlasts a short KV lease, every answer judged; feeds BENCHMARKS.md, "Prefill's KV
lease" (issue 39).

    flock /tmp/hs-servers.lock .venv/bin/python benchmarks/lease_burst.py [--lease-s 3] [--requests 12]
        [--max-num-seqs 1] [--max-tokens 128] [--prompt-len 512] [--out benchmarks/results/lease_burst.json]
    H200: bash benchmarks/h200.sh lease-burst (60 layers, CUDA graphs, vLLM's own GDN backend, async scheduling)
    --attach STATE: the pd-lease deployment that `benchmarks/served_h200.py start` left running (its launch JSON,
    topology and timeline in that folder), measured as it is and left running: no cold start of its own

`launch --role all` (one prefill, one decode; the lease guard launch arms; the timeline on) with `kv_lease_s` short
and `max_num_seqs` low, so that the burst's later requests wait in decode's queue longer than the lease. Prefill's
own greedy answers to the pool's prompts (random token ids) are asked first, twice (core/chaos/reference.py: they set
the judging limits), then every request of the burst goes at once through the proxy (every other one streamed) and
each answer is judged (core/chaos/burst.py). Then `--stall-probes` times, decode's processes are SIGSTOPped past the
lease while other prompts reuse prefill's freed blocks (core/chaos/stall.py), so that the guard's refusal and the
recompute after it run on this vLLM too. Goal: wrong 0. Exit 0 when it is met and every request was answered right.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

from hybridserve.core.chaos import stall
from hybridserve.core.chaos.burst import count_refused, send_burst, tally_burst
from hybridserve.core.chaos.bounded_load import Load
from hybridserve.core.chaos.reference import references, widen_by_other_engine
from hybridserve.core.chaos.session import kill_groups, start_launch, stop_launcher
from hybridserve.core.chaos.timeline_gaps import breakdown
from hybridserve.core.common.atomic_file import write_text
from hybridserve.core.deployments.target import default_model
from hybridserve.core.validate.random_prompts import vocab_size
from hybridserve.core.validate.thresholds import Thresholds


def topology(args: argparse.Namespace, model: Path) -> dict:
    b, last = args.base_port, (max(1, os.cpu_count() or 1) - 1 if args.device == "cpu" else 0)
    engine = {"kv_lease_s": args.lease_s, "max_num_seqs": args.max_num_seqs, "max_model_len": args.max_model_len,
              "async_scheduling": True, **args.engine}
    return {"model": str(model), "device": args.device, "engine": engine,
            "prefill": [{"port": b + 100, "side_channel_port": b + 150, "devices": [0]}],
            "decode": [{"port": b + 200, "side_channel_port": b + 250, "devices": [last]}],
            "proxy": {"port": b, "timeout_s": args.timeout}}


def prompts(model: Path, num: int, length: int) -> list[list[int]]:
    rng, vocab = random.Random(39), vocab_size(model)
    return [[rng.randrange(vocab) for _ in range(length)] for _ in range(num)]


def attached(state: Path) -> tuple[dict, Path, dict[str, str], Path]:
    """served_h200.py's pd-lease: (its topology, run folder, endpoints, timeline file)."""
    launched = json.loads((state / "launch-pd-lease.json").read_text() or "{}")
    if "endpoints" not in launched:
        raise SystemExit(f"--attach {state}: pd-lease is not serving (served_h200.py start, then this)")
    topo = yaml.safe_load((state / "pd-lease.yaml").read_text())
    return topo, Path(launched["run_dir"]), launched["endpoints"], state / "timeline-lease.jsonl"


def run(args: argparse.Namespace) -> dict:
    model = (args.model or default_model()).resolve()
    with tempfile.TemporaryDirectory(prefix="lease-burst-") as tmp:
        tmp_path = Path(tmp)
        launcher = None
        try:
            if args.attach:
                topo, run_dir, endpoints, timeline = attached(args.attach)
                model = Path(topo["model"]).resolve()
                args.lease_s = topo["engine"]["kv_lease_s"]
                args.max_num_seqs = topo["engine"].get("max_num_seqs", args.max_num_seqs)
            else:
                topo, timeline = topology(args, model), tmp_path / "timeline.jsonl"
                (tmp_path / "topology.yaml").write_text(json.dumps(topo))
                launcher, run_dir, endpoints = start_launch(tmp_path, timeout_s=args.start_timeout, restart="never")
            load = Load(endpoints["proxy"], model.name, prompts(model, args.num_prompts, args.prompt_len),
                        max_tokens=args.max_tokens, timeout_s=args.timeout)
            bodies = [load.body(i) for i in range(args.num_prompts)]
            answers, thresholds, noise = references(endpoints["prefill-0"], bodies, Thresholds(),
                                                    timeout_s=args.timeout, concurrency=args.max_num_seqs)
            # decode computes a refused READ's prompt itself: its own numerics are within what is not wrong
            thresholds, decode_noise = widen_by_other_engine(endpoints["decode-0"], bodies, answers, thresholds,
                                                             timeout_s=args.timeout, concurrency=args.max_num_seqs)
            sent, seconds = send_burst(load, args.requests)
            result = tally_burst(sent, seconds, answers, thresholds, timeline=timeline,
                                 run_dir=run_dir, proxy_url=endpoints["proxy"], lease_s=args.lease_s)
            probes = stall_probes(args, endpoints, run_dir, load, answers[0], thresholds)
            if args.keep_logs:
                args.keep_logs.mkdir(parents=True, exist_ok=True)
                for log in run_dir.glob("*.log"):
                    (args.keep_logs / log.name).write_text(log.read_text(errors="replace")[-200_000:])
            return {"topology": topo, "attached": str(args.attach) if args.attach else None,
                    "result": asdict(result), "stall_probes": probes,
                    "judging": {"thresholds": asdict(thresholds), "noise": asdict(noise),
                                "decode_noise": asdict(decode_noise)},
                    "timeline": breakdown(timeline)}  # where each request's time went
        finally:
            stop_launcher(launcher)  # an attached deployment is served_h200.py's to stop
            for folder in (tmp_path / "runs").glob("*/"):
                kill_groups(folder)


def stall_probes(args: argparse.Namespace, endpoints: dict, run_dir: Path, load: Load, ref, thresholds) -> dict:
    """Decode stopped lease + 7 s while three prompts reuse prefill's freed blocks, `--stall-probes` times."""
    # asked as the load asks (tokens as ids): `ref` is the load's reference answer (a text-keyed answer against an
    # id-keyed one "diverged at token 0" in the CPU smoke of --attach, 2026-12-05: a judging artifact, not a READ)
    probe = stall.Probe(model=load.model, prompt=load.prompts[0], max_tokens=load.max_tokens, thresholds=thresholds,
                        timeout_s=args.timeout, is_token_ids=True)
    before, results = count_refused(run_dir), []
    pgid = int((run_dir / "decode-0.pid").read_text())
    for _ in range(args.stall_probes):
        results.append(stall.stalled_decode(endpoints["proxy"], endpoints["prefill-0"], pgid, probe, ref,
                                            stop_s=args.lease_s + 7, lease_s=args.lease_s))
    return {"outcomes": [r.outcome.value for r in results], "results": [asdict(r) | {"outcome": r.outcome.value}
                                                                         for r in results],
            "refused": count_refused(run_dir) - before}


def render(console: Console, out: dict) -> None:
    r, engine = out["result"], out["topology"]["engine"]
    table = Table(title=f"a burst of {r['num_requests']} past a {engine['kv_lease_s']} s KV lease "
                        f"(max_num_seqs {engine['max_num_seqs']}, {out['topology']['device']})")
    for column in ("right", "wrong", "errors", "burst s", "decode queue max / p50 s", "READ after prefill max / p50 s",
                   "READs past the lease", "refused (guard)", "expired (prefill)", "late reads (prefill)", "proxy"):
        table.add_column(column)
    table.add_row(str(r["right"]), str(r["wrong"]), str(r["errors"]), str(r["seconds"]),
                  f"{r['decode_wait_s']['max']} / {r['decode_wait_s']['p50']}",
                  f"{r['lease_needed_s']['max']} / {r['lease_needed_s']['p50']}", str(r["num_over_lease"]),
                  str(r["refused"]), str(r["expired"]), str(r["late_reads"]), json.dumps(r["proxy_lease"]))
    console.print(table)
    for one in r["wrong_answers"][:5] + [{"why": e} for e in r["errors_told"][:5]]:
        console.print(f"  {one}", markup=False, highlight=False, soft_wrap=True)
    for gap in out["timeline"]["gaps"]:
        console.print(f"  {gap['gap']}: p50 {gap['p50_ms']:.0f} ms, p90 {gap['p90_ms']:.0f} ms ({gap['count']})",
                      markup=False, highlight=False)
    probes = out["stall_probes"]
    if probes["outcomes"]:
        console.print(f"decode stopped {engine['kv_lease_s'] + 7} s with the blocks reused: {probes['outcomes']}, "
                      f"READs refused by the guard: {probes['refused']}", markup=False, highlight=False)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--model", type=Path, default=None, help="default: the trained recall model")
    parser.add_argument("--lease-s", type=int, default=3)
    parser.add_argument("--max-num-seqs", type=int, default=1)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--requests", type=int, default=12)
    parser.add_argument("--num-prompts", type=int, default=6)
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--stall-probes", type=int, default=0, help="decode stopped past the lease, this many times")
    parser.add_argument("--engine", type=json.loads, default={}, help="more topology engine keys, as JSON")
    parser.add_argument("--base-port", type=int, default=19300)
    parser.add_argument("--timeout", type=float, default=300.0, help="per request, and the proxy's per hop")
    parser.add_argument("--start-timeout", type=float, default=420.0)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/lease_burst.json"))
    parser.add_argument("--keep-logs", type=Path, default=None)
    parser.add_argument("--attach", type=Path, default=None, help="served_h200.py's state folder: its pd-lease")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    out = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_text(args.out, json.dumps(out, indent=1) + "\n")
    if args.json:
        print(json.dumps(out))
    else:
        render(Console(), out)
    r, probes = out["result"], out["stall_probes"]["outcomes"]
    is_met = r["wrong"] == 0 and r["errors"] == 0 and r["right"] == r["num_requests"]
    return 0 if is_met and all(o == "right" for o in probes) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
