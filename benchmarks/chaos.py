"""SIGKILLs decode, prefill and the proxy of a `launch --restart on-failure` deployment in turn under a bounded load;
feeds BENCHMARKS.md, "Role deaths under load (chaos), CPU".

    flock /tmp/hs-servers.lock timeout 1500 .venv/bin/python benchmarks/chaos.py [--decodes 2]
        [--router hybridserve vllm-router] [--kills decode-0,decode-1@8 prefill-0 proxy]
        [--base-port 19600] [--out benchmarks/results/chaos.json] [--json] [--keep-logs DIR]

Each `--kills` entry is one phase: the roles it SIGKILLs (`role@s`: s seconds after the phase's first kill); the
load (3 clients back to back, every other request streamed, prompts from a pool of 8) runs `--load-s` after the
phase's last kill, then pauses until launch has brought every role back and the surviving engines' KV usage is idle
(or the lease + 10 s). The model is the trained recall model unless `--model` names another. With
`--router vllm-router` the same deployment runs behind vLLM's router (the router extra), as a second table. On CUDA:
`--device cuda --model /tmp/m60 --engine '{"max_model_len": 34816}'` (benchmarks/h200.sh chaos: launch's CUDA
defaults otherwise, so CUDA graphs and vLLM's own GDN prefill). Prints one table per front end and writes every count, KV sample and restart event as JSON; a run that stops
in a phase (a role that never came back) still reports the phases before it, with the reason. Every OK answer is
judged against prefill's own greedy answer to its prompt (core/chaos/reference.py, validate's near-tie rules):
"wrong" counts those that are not it (HTTP 200 with another answer), and its goal is 0.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from rich.console import Console

from hybridserve.cli.console import FitConsole
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from hybridserve.core.chaos.session import ChaosResult, ChaosSpec, parse_phase, run_chaos
from hybridserve.core.common.atomic_file import write_text

COLUMNS = ("kill", "decode alive", "sent", "ok", "wrong", "retried", "fell back", "failed", "unexcused", "lost",
           "refused", "first ok s", "restart s", "KV idle s", "goals")


def render(console: Console, router: str, result: ChaosResult) -> None:
    table = Table(title=f"role deaths under load behind {router} (launch exit {result.launch_exit}, left running: "
                        f"{len(result.left_running)})")
    for column in COLUMNS:
        table.add_column(column)
    for row in result.rows:
        held = next((h for phase, h in result.kv_held.items() if phase.split()[0] == row.kill.split()[0]), {})
        kv = ", ".join(f"{n} {'-' if s is None else s}" for n, s in held.items()) or "-"
        table.add_row(row.kill, row.alive_decodes, str(row.sent), str(row.ok), f"{row.wrong} of {row.judged}",
                      str(row.retried), str(row.fell_back),
                      str(row.failed), str(row.unexcused), str(row.lost), str(row.refused),
                      _s(row.first_ok_s), _s(row.restart_s), kv, "; ".join(row.goals_met) or "-")
    console.print(table)
    if result.error:
        console.print(f"the run stopped before its last phase: {result.error}", markup=False, highlight=False,
                      soft_wrap=True)
    limits = result.judging.get("thresholds") or {}
    console.print(f"answers judged against {result.judging.get('reference', '-')}'s own (near-tie tolerance "
                  f"{limits.get('near_tie_tolerance')}, drift limit {limits.get('max_logprob_drift')}); wrong: "
                  f"{len(result.wrong)}", markup=False, highlight=False, soft_wrap=True)
    for one in result.wrong[:5]:
        console.print(f"  wrong: request {one['rid']} (prompt {one['prompt_index']}): {one['why']}", markup=False,
                      highlight=False, soft_wrap=True)
    console.print(f"requests completed by each restarted engine after its restart: {result.served_again}")
    for kill, seconds in result.peer_released.items():
        console.print(f"decodes that gave back a dead engine's NIXL state after killing {kill}: {len(seconds)}, "
                      f"s after the kill: {seconds}", markup=False, highlight=False, soft_wrap=True)
    for kill, health in result.front_health.items():
        console.print(f"front end's /health 2 s after killing {kill}: {health}", markup=False, highlight=False,
                      soft_wrap=True)


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def as_dict(router: str, result: ChaosResult) -> dict:
    return {"router": router, "rows": [asdict(r) | {"is_met": r.is_met} for r in result.rows],
            "kv_held_s": result.kv_held, "served_again": result.served_again, "left_running": result.left_running,
            "launch_exit": result.launch_exit, "restarts": result.restarts, "front_health": result.front_health,
            "failures": result.failures, "kills": result.kills, "peer_released_s": result.peer_released,
            "kv_samples": [list(s) for s in result.kv_samples], "error": result.error, "wrong": result.wrong,
            "judging": result.judging}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--router", nargs="+", default=["hybridserve"], choices=["hybridserve", "vllm-router"])
    parser.add_argument("--decodes", type=int, default=2, choices=[1, 2])
    parser.add_argument("--kills", nargs="+", default=["decode-0,decode-1@8", "prefill-0", "proxy"])
    parser.add_argument("--base-port", type=int, default=19600)
    parser.add_argument("--load-s", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--engine", type=json.loads, default={}, help="topology engine keys, as JSON")
    parser.add_argument("--start-timeout", type=float, default=420.0)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/chaos.json"))
    parser.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    parser.add_argument("--keep-logs", type=Path, default=None,
                        help="copy each role's log, the restart events and launch's output here (one folder a router)")
    args = parser.parse_args(argv)
    console, err = FitConsole(), Console(stderr=True)
    everything, all_met = [], True
    for i, router in enumerate(args.router):
        spec = ChaosSpec(kills=tuple(parse_phase(k) for k in args.kills), num_decodes=args.decodes, router=router,
                         base_port=args.base_port + 10 * i, model=args.model, device=args.device, engine=args.engine,
                         num_clients=args.clients, load_s=args.load_s, start_timeout_s=args.start_timeout,
                         keep_logs=args.keep_logs / router if args.keep_logs else None)
        with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=err,
                      transient=True) as progress:
            task = progress.add_task(f"{router}: starting", total=None)
            result = run_chaos(spec, on_phase=lambda m: progress.update(task, description=f"{router}: {m}"))
        if not args.json:
            render(console, router, result)
        everything.append(as_dict(router, result))
        all_met = all_met and all(r.is_met for r in result.rows) and not result.left_running and not result.error
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_text(args.out, json.dumps(everything, indent=1) + "\n")
    if args.json:
        print(json.dumps(everything))
    else:
        console.print(f"wrote {args.out}")
    return 0 if all_met else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
