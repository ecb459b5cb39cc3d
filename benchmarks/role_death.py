"""Measures `hybridserve launch --router` and the project's proxy when a role dies; feeds BENCHMARKS.md,
"Role death behind the proxy and vllm-router, CPU".

What a client sees when a role dies, behind the project's proxy and behind vllm-router (tiny model, CPU, P/D).

    flock /tmp/hs-servers.lock .venv/bin/python benchmarks/role_death.py [--kinds hybridserve vllm-router]
        [--base-port 19400] [--out benchmarks/results/role_death.json]

For each front end: start prefill, decode and the front end (launch's plan and runner, without launch's supervisor,
which would stop every role once one dies), then for decode and then prefill:
1. a long request (max_tokens 400) is in flight when the role is SIGKILLed: its status, body and time to answer;
2. one request every 0.5 s for `--probe-s` seconds while the role stays dead: status, body, latency;
3. the role is started again; once it is healthy, requests every 0.5 s until one succeeds: time to recover.
Prints a table per front end and writes every probe as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from hybridserve.core.launch.launch_plan import Role
from hybridserve.core.launch.machine import machine_plan
from hybridserve.core.launch.topology import ProxyKind, local_topology
from hybridserve.core.supervise.health import wait_healthy
from hybridserve.core.supervise.process import kill_role, start_role
from hybridserve.core.supervise.runner import started

PROMPT = "hello world " * 40
MODEL = "tiny-qwen3.5"
PROBE_EVERY_S = 0.5


def ask(url: str, max_tokens: int = 4, timeout_s: float = 60.0) -> dict:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}
    t0 = time.monotonic()
    try:
        response = httpx.post(f"{url}/v1/completions", json=body, timeout=timeout_s)
        status, text = response.status_code, response.text
    except httpx.HTTPError as exc:
        status, text = None, f"{type(exc).__name__}: {exc}"
    return {"status": status, "body": text[:300], "latency_s": round(time.monotonic() - t0, 3)}


def _health(url: str) -> int | None:
    try:
        return httpx.get(f"{url}/health", timeout=5).status_code
    except httpx.HTTPError:
        return None


def in_flight_then_kill(url: str, role, kill_after_s: float = 1.0) -> dict:  # noqa: ANN001 (RunningRole)
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(ask(url, max_tokens=400, timeout_s=180)))
    thread.start()
    time.sleep(kill_after_s)
    killed_at = time.monotonic()
    kill_role(role)
    thread.join()
    result["answer_after_kill_s"] = round(time.monotonic() - killed_at, 3)
    return result


def probes(url: str, seconds: float, *, until_ok: bool = False) -> list[dict]:
    out, t0 = [], time.monotonic()
    while time.monotonic() - t0 < seconds:
        probe = ask(url, timeout_s=30) | {"at_s": round(time.monotonic() - t0, 2)}
        out.append(probe)
        if until_ok and probe["status"] == 200:
            break
        time.sleep(PROBE_EVERY_S)
    return out


def measure(kind: ProxyKind, base_port: int, probe_s: float, run_dir: Path) -> dict:
    topology = local_topology(base_port=base_port)
    topology = replace(topology, proxy=replace(topology.proxy, kind=kind, timeout_s=30.0))
    plan = machine_plan(topology, Role.ALL)
    url = plan.command("proxy").url
    results: dict = {"kind": kind.value}
    with started(plan, run_dir, timeout_s=420) as roles:
        assert ask(url)["status"] == 200, "warm-up request failed"
        for name in ("decode-0", "prefill-0"):
            role = next(r for r in roles if r.name == name)
            entry = {"in_flight": in_flight_then_kill(url, role), "while_dead": probes(url, probe_s),
                     "front_health_while_dead": _health(url)}
            back = start_role(role.command, run_dir)
            roles[roles.index(role)] = back  # `started` stops it on the way out
            wait_healthy([back], timeout_s=420)
            entry["after_restart"] = probes(url, 60, until_ok=True)
            results[name] = entry
    return results


def render(console: Console, results: dict) -> None:
    table = Table(title=f"role death behind {results['kind']}")
    for column in ("role", "phase", "status(es)", "latency s", "body (first)"):
        table.add_column(column)
    for name in ("decode-0", "prefill-0"):
        entry = results[name]
        flight = entry["in_flight"]
        table.add_row(name, "in flight at kill", str(flight["status"]), f"{flight['answer_after_kill_s']}",
                      flight["body"][:90])
        dead = entry["while_dead"]
        statuses = sorted({str(p["status"]) for p in dead})
        lat = [p["latency_s"] for p in dead]
        table.add_row("", f"dead, {len(dead)} probes", ", ".join(statuses), f"{min(lat)}-{max(lat)}",
                      dead[0]["body"][:90])
        table.add_row("", "front /health while dead", str(entry["front_health_while_dead"]), "", "")
        after = entry["after_restart"]
        table.add_row("", "after restart", ", ".join(str(p["status"]) for p in after),
                      f"first ok at {after[-1]['at_s']} s" if after[-1]["status"] == 200 else "no ok", "")
    console.print(table)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", nargs="+", default=[k.value for k in ProxyKind])
    parser.add_argument("--base-port", type=int, default=19400)
    parser.add_argument("--probe-s", type=float, default=12.0)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/role_death.json"))
    args = parser.parse_args(argv)
    console, everything = Console(), []
    for i, kind in enumerate(ProxyKind.parse(k) for k in args.kinds):
        with tempfile.TemporaryDirectory(prefix="role-death-") as tmp:
            results = measure(kind, args.base_port + 10 * i, args.probe_s, Path(tmp))
        render(console, results)
        everything.append(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(everything, indent=2) + "\n")
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main(sys.argv[1:])
