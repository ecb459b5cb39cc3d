"""Issue 39's probes of prefill's KV lease, with the lease guard and without it; feeds BENCHMARKS.md, "Prefill's KV
lease".

    flock /tmp/hs-servers.lock .venv/bin/python benchmarks/lease_probes.py [--lease-s 3 --stop-s 8] [--runs 3]
        [--guard on off] [--out benchmarks/results/lease_probes.json]

For each `--guard`: `launch --role all` of the trained recall model (async scheduling, `kv_lease_s`, one sequence at
a time; the guard off: HYBRIDSERVE_LEASE_GUARD=0 on both engines), then core/chaos/stall.py's probes, each judged
against prefill's own greedy answer: `--runs` times decode SIGSTOPped `--stop-s` through the proxy while three other
prompts reuse the freed blocks, as issue 39's client asked (no logprobs: the text judged exactly) and with top-2
logprobs (validate's near-tie rules); `--runs` times vLLM's own decode hop sent after the lease; once a request
queued behind a long one past the lease. Prints one table per guard setting: right / wrong / error per probe, the
guard's refusals, prefill's expired leases and late reads.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from rich.console import Console
from rich.table import Table

from hybridserve.core.chaos import stall
from hybridserve.core.chaos.burst import EXPIRED_LOG, LATE_READ_LOG, count_refused
from hybridserve.core.chaos.session import kill_groups, start_launch, stop_launcher
from hybridserve.core.deployments.target import RECALL_MODEL_DIR
from hybridserve.core.validate import load_dataset


def topology(args: argparse.Namespace, guard: str) -> dict:
    env = {} if guard == "on" else {"HYBRIDSERVE_LEASE_GUARD": "0"}
    last, b = max(1, os.cpu_count() or 1) - 1, args.base_port
    return {"model": str(RECALL_MODEL_DIR), "device": "cpu",
            "engine": {"kv_lease_s": args.lease_s, "max_num_seqs": 1, "max_model_len": 4096, "async_scheduling": True},
            "prefill": [{"port": b + 100, "side_channel_port": b + 150, "devices": [0], "env": env}],
            "decode": [{"port": b + 200, "side_channel_port": b + 250, "devices": [last], "env": env}],
            "proxy": {"port": b, "timeout_s": 300}}


def probes(args: argparse.Namespace, endpoints: dict, run_dir: Path) -> dict[str, list]:
    prompt = load_dataset("synthetic", num_prompts=1, seed=11).examples[0].prompt
    plain = stall.Probe(model=RECALL_MODEL_DIR.name, prompt=prompt, max_tokens=16, is_logprobs=False)
    with_logprobs = stall.Probe(model=RECALL_MODEL_DIR.name, prompt=prompt, max_tokens=16)
    prefill, ref = endpoints["prefill-0"], stall.reference(endpoints["prefill-0"], with_logprobs)
    stall.ask(endpoints["proxy"], plain.body(), 120)  # NIXL's handshake, before any probe
    pgid = int((run_dir / "decode-0.pid").read_text())
    out: dict[str, list] = {"stalled, no logprobs": [], "stalled, logprobs": [], "late decode hop": []}
    for _ in range(args.runs):
        for name, probe in (("stalled, no logprobs", plain), ("stalled, logprobs", with_logprobs)):
            out[name].append(stall.stalled_decode(endpoints["proxy"], prefill, pgid, probe, ref, stop_s=args.stop_s,
                                                  lease_s=args.lease_s))
        out["late decode hop"].append(stall.late_decode_hop(prefill, endpoints["decode-0"], plain, ref,
                                                            lease_s=args.lease_s))
    queued = stall.queued_past_lease(endpoints["proxy"], with_logprobs, ref, long_max_tokens=2000,
                                     decode_url=endpoints["decode-0"])
    out[f"queued {queued.queue_s} s in decode's queue behind a long one ({queued.long_s} s)"] = [queued.result]
    return out


def run_one(args: argparse.Namespace, guard: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="lease-probes-") as tmp:
        tmp_path, launcher = Path(tmp), None
        (tmp_path / "topology.yaml").write_text(json.dumps(topology(args, guard)))
        try:
            launcher, run_dir, endpoints = start_launch(tmp_path, timeout_s=420, restart="never")
            found = probes(args, endpoints, run_dir)
            prefill_log = (run_dir / "prefill-0.log").read_text(errors="replace")
            return {"guard": guard, "lease_s": args.lease_s, "stop_s": args.stop_s,
                    "probes": {k: [asdict(r) | {"outcome": r.outcome.value} for r in v] for k, v in found.items()},
                    "refused": count_refused(run_dir), "expired": prefill_log.count(EXPIRED_LOG),
                    "late_reads": prefill_log.count(LATE_READ_LOG)}
        finally:
            stop_launcher(launcher)
            for folder in (tmp_path / "runs").glob("*/"):
                kill_groups(folder)


def render(console: Console, one: dict) -> None:
    table = Table(title=f"lease guard {one['guard']}: {one['lease_s']} s lease, decode stopped {one['stop_s']} s "
                        f"(refused {one['refused']}, prefill expired {one['expired']}, late reads "
                        f"{one['late_reads']})")
    for column in ("probe", "right", "wrong", "error", "what came back"):
        table.add_column(column)
    for name, results in one["probes"].items():
        count = {o: sum(r["outcome"] == o for r in results) for o in ("right", "wrong", "error")}
        seen = "; ".join(sorted({f"{r['status']} {str(r['why'] or r['text'])[:60]}" for r in results
                                 if r["outcome"] != "right"})) or "-"
        table.add_row(name, str(count["right"]), str(count["wrong"]), str(count["error"]), seen)
    console.print(table)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lease-s", type=int, default=3)
    parser.add_argument("--stop-s", type=float, default=8.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--guard", nargs="+", default=["on", "off"], choices=["on", "off"])
    parser.add_argument("--base-port", type=int, default=19400)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/lease_probes.json"))
    args = parser.parse_args(argv)
    console, everything = Console(), []
    for guard in args.guard:
        everything.append(run_one(args, guard))
        render(console, everything[-1])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(everything, indent=1) + "\n")
    on = [o for o in everything if o["guard"] == "on"]
    return 0 if all(r["outcome"] == "right" for o in on for v in o["probes"].values() for r in v) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
