"""One decode of two SIGKILLed under non-streamed load, run after run on one deployment; feeds BENCHMARKS.md,
"Role deaths under load (chaos), CPU" (issue 39: 3 of 30 such requests failed in one run of three, the other decode
alive, cause not recorded).

    flock /tmp/hs-servers.lock timeout 3000 .venv/bin/python benchmarks/decode_death_runs.py [--runs 10]
        [--requests 30] [--kill-after 6] [--clients 4] [--out benchmarks/results/decode_death_runs.json]

`launch --role all --restart on-failure` with one prefill and two decodes (the chaos bench's topology, the trained
recall model). Each run: every role serving, then `--requests` non-streamed completions from `--clients` clients
at once through the proxy, one decode's process group SIGKILLed once `--kill-after` of them were answered (decode-0
and decode-1 in turn: launch's restart cap is 5 deaths of one role in 10 minutes); launch restarts it before the
next run. With `--stall-s`, the survivors' API servers (prefill's and the other decode's) are also SIGSTOPped that
long from the kill: what a starved 2-core box does to them while the dead decode restarts beside them. Every failed
request keeps what the client was told and the proxy's log lines naming it; every OK answer is judged against
prefill's own (core/chaos/reference.py). Goal: 0 failed and 0 wrong in every run. Exit 0 when it is met.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from hybridserve.core.chaos.load import Load
from hybridserve.core.chaos.reference import prompt_pool, references
from hybridserve.core.chaos.session import (
    ChaosSpec, _kill_groups, _lines_naming, _model_name, _stop_launcher, _wait_all_up, start_launch, topology_yaml,
)
from hybridserve.core.chaos.tally import verdicts
from hybridserve.core.common import keepalive
from hybridserve.core.chaos.timeline_gaps import read_events
from hybridserve.core.validate.thresholds import Thresholds


def _pid(run_dir: Path, role: str) -> int:
    return int((run_dir / f"{role}.pid").read_text())  # the group's leader: the role's API server


def kill(run_dir: Path, victim: str, stall_s: float) -> float:
    """SIGKILL `victim`'s process group; SIGSTOP the other engines' API servers for `stall_s` (0: none)."""
    os.killpg(_pid(run_dir, victim), signal.SIGKILL)
    at = time.time()
    if stall_s > 0:
        for role in ("prefill-0", "decode-0", "decode-1"):
            if role != victim:
                os.kill(_pid(run_dir, role), signal.SIGSTOP)
                threading.Timer(stall_s, os.kill, (_pid(run_dir, role), signal.SIGCONT)).start()
    return at


def one_run(load: Load, run_dir: Path, args: argparse.Namespace, victim: str) -> tuple[list, float]:
    """(the requests as the clients saw them, when the victim was killed)."""
    done, killed, lock = [0], [0.0], threading.Lock()
    limits = httpx.Limits(keepalive_expiry=keepalive.IDLE_EXPIRY_S)

    def send(i: int):  # noqa: ANN202
        sent = load.send(client, is_stream=False, prompt_index=i % len(load.prompts))
        with lock:
            done[0] += 1
            if done[0] == args.kill_after:
                killed[0] = kill(run_dir, victim, args.stall_s)
        return sent

    with httpx.Client(timeout=load.timeout_s, limits=limits) as client, \
            ThreadPoolExecutor(max_workers=args.clients) as pool:  # one pool of connections, as a client has
        return list(pool.map(send, range(args.requests))), killed[0]


def _proxy_events(timeline: Path, rids: set[str], event: str) -> int:
    """Requests of `rids` with a proxy `event` in the timeline: `retry` (a hop tried on another server), `fallback`
    (served by one role alone)."""
    if not timeline.is_file():
        return 0
    return len({e["req"] for e in read_events(timeline) if e.get("event") == event and e.get("req") in rids})


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--kill-after", type=int, default=6)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--base-port", type=int, default=19500)
    parser.add_argument("--stall-s", type=float, default=0.0,
                        help="SIGSTOP the other engines' API servers this long from each kill")
    parser.add_argument("--engine-env", nargs="*", default=[], metavar="NAME=VALUE",
                        help="more environment for every engine (an A/B: VLLM_HTTP_TIMEOUT_KEEP_ALIVE=5 is vLLM's own)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/decode_death_runs.json"))
    args = parser.parse_args(argv)
    spec = ChaosSpec(kills=(), num_decodes=2, base_port=args.base_port,
                     env=dict(item.split("=", 1) for item in args.engine_env))
    runs = []
    with tempfile.TemporaryDirectory(prefix="decode-death-") as tmp:
        tmp_path, launcher = Path(tmp), None
        (tmp_path / "topology.yaml").write_text(topology_yaml(spec))
        try:
            launcher, run_dir, endpoints = start_launch(tmp_path, timeout_s=spec.start_timeout_s)
            load = Load(endpoints["proxy"], _model_name(spec), prompt_pool(8), max_tokens=spec.max_tokens)
            _wait_all_up(endpoints, timeout_s=spec.start_timeout_s)
            answers, thresholds, _ = references(endpoints["prefill-0"], [load.body(i) for i in range(8)],
                                                Thresholds())
            for number in range(args.runs):
                _wait_all_up(endpoints, timeout_s=spec.start_timeout_s)
                time.sleep(3)  # a restarted decode's first request makes its NIXL handshake: not part of the load
                victim = f"decode-{number % 2}"
                sent, killed = one_run(load, run_dir, args, victim)
                judged = verdicts(sent, answers, thresholds)
                failed = [s for s in sent if not s.is_ok]
                lines = _lines_naming({s.rid for s in failed}, run_dir / "proxy.log")
                runs.append({"run": number + 1, "killed_role": victim, "failed": len(failed),
                             "retried": _proxy_events(tmp_path / "timeline.jsonl", {s.rid for s in sent}, "retry"),
                             "fell_back": _proxy_events(tmp_path / "timeline.jsonl", {s.rid for s in sent},
                                                        "fallback"),
                             "wrong": sum(v is not None
                                                                                   for v in judged.values()),
                             "ok": sum(s.is_ok for s in sent), "killed": killed,
                             "failures": [{"rid": s.rid, "after_kill_s": round(s.start - killed, 2),
                                           "told": s.error, "proxy_log": lines.get(s.rid, [])} for s in failed]})
                print(json.dumps(runs[-1]), flush=True)
        finally:
            _stop_launcher(launcher)
            for folder in (tmp_path / "runs").glob("*/"):
                _kill_groups(folder)
    table = Table(title=f"one decode of two SIGKILLed after {args.kill_after} of {args.requests} non-streamed "
                        f"requests ({args.clients} clients, the others' API servers stopped {args.stall_s} s)")
    for column in ("run", "killed", "ok", "failed", "wrong", "retried", "fell back", "first failure"):
        table.add_column(column)
    for run in runs:
        first = run["failures"][0]["told"] if run["failures"] else "-"
        table.add_row(str(run["run"]), run["killed_role"], str(run["ok"]), str(run["failed"]), str(run["wrong"]),
                      str(run["retried"]), str(run["fell_back"]), str(first)[:80])
    Console().print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(runs, indent=1) + "\n")
    return 0 if runs and all(r["failed"] == 0 and r["wrong"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
