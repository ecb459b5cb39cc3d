"""Measures `hybridserve launch --tuned-profile`; feeds BENCHMARKS.md, "The tuned profile served, H200".

`launch --tuned-profile` against vLLM's default GDN prefill, in one run: TTFT of 1k prompts (and of every length
of the mix), prefill throughput of a 1k/8k/32k mix, and whether the greedy tokens are identical. JSON out.

Usage (H200, vLLM 0.26; the model from scripts/make_gdn_bench_model.py):
    python benchmarks/served_tuned_profile.py --model /tmp/gdn-tp2 --profile profiles/tuned/h200.yaml --device cuda \
        --out $OUT/served_tuned_profile.json
On CPU (a smoke run with the tiny model): --device cpu --lengths 64 256 512 --mix 4 2 1 --ttft-prompts 3.

Each configuration is one plain vLLM server (launch's Role.SINGLE); the tuned one differs only by `--tuned-profile`
(the plugin routes each prefill batch, and on CUDA `--gdn-prefill-backend` is its closest setting) and its ports.
Both servers run at once (on CUDA on the same GPUs, each given `--gpu-share` of their memory; on CPU on cores 0
and 1), and the measurements alternate between them, so neither profits from running second (a warm disk cache,
GPU clocks): an earlier run that served them one after the other measured 0.85x in one order and 1.11x in the other.
With --control a third server, a second copy of the default, runs beside them: default / control is an A/A ratio,
the noise floor of the same run (the H200 run 4 measured 1.09x at 8k between two servers running the same kernel).
Both are warmed up with one prompt of each length and the mix once before anything is measured. TTFT is measured
with streaming (time to the first streamed token), one request at a time, the order rotating (default, tuned;
tuned, default; ...). Throughput: the whole mix sent at once, max_tokens=1, prompt tokens / wall time, twice per server
(ABBA). Greedy: `--greedy-tokens` tokens of one prompt per length, temperature 0.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

LOG_MARK = "hybridserve: GDN prefill bucket"


def prompt_ids(length: int, index: int, vocab: int = 1000) -> list[int]:
    """A deterministic prompt of `length` token ids (distinct per index, no special ids below 50)."""
    return [(97 * j + 131 * index + 7 * length) % (vocab - 50) + 50 for j in range(length)]


def mix_prompts(lengths: list[int], counts: list[int], offset: int = 0) -> list[list[int]]:
    return [prompt_ids(n, offset + i) for n, c in zip(lengths, counts) for i in range(c)]


def ttft_s(client, url: str, model: str, ids: list[int]) -> float:
    body = {"model": model, "prompt": ids, "max_tokens": 1, "temperature": 0.0, "stream": True, "ignore_eos": True}
    started = time.perf_counter()
    with client.stream("POST", f"{url}/v1/completions", json=body) as reply:
        reply.raise_for_status()
        for line in reply.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                return time.perf_counter() - started
    raise RuntimeError("the server streamed no token")


def greedy_tokens(client, url: str, model: str, ids: list[int], num_tokens: int) -> list[str]:
    body = {"model": model, "prompt": ids, "max_tokens": num_tokens, "temperature": 0.0, "logprobs": 1,
            "ignore_eos": True}
    reply = client.post(f"{url}/v1/completions", json=body)
    reply.raise_for_status()
    return reply.json()["choices"][0]["logprobs"]["tokens"]


def throughput(url: str, model: str, prompts: list[list[int]], timeout_s: float) -> dict:
    import httpx

    def one(ids: list[int]) -> None:
        with httpx.Client(timeout=timeout_s) as client:
            body = {"model": model, "prompt": ids, "max_tokens": 1, "temperature": 0.0, "ignore_eos": True}
            client.post(f"{url}/v1/completions", json=body).raise_for_status()

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        list(pool.map(one, prompts))
    wall = time.perf_counter() - started
    tokens = sum(len(p) for p in prompts)
    return {"prompt_tokens": tokens, "wall_s": round(wall, 4), "prefill_tok_per_s": round(tokens / wall, 1)}


def alternating(names: list[str], index: int) -> list[str]:
    """The configurations rotated by one place a turn: each takes every place equally often (two: ABBA...)."""
    shift = index % len(names)
    return names[shift:] + names[:shift]


def measure(urls: dict[str, str], model: str, args: argparse.Namespace) -> dict[str, dict]:
    """Every configuration's TTFT, mix throughput and greedy tokens, the requests alternating between them."""
    import httpx

    names = list(urls)
    ttft: dict[str, dict[str, list[float]]] = {name: {str(n): [] for n in args.lengths} for name in names}
    runs: dict[str, list[dict]] = {name: [] for name in names}
    with httpx.Client(timeout=args.timeout) as client:
        for n in args.lengths:  # warm-up: first-call compilation of every kernel shape class
            for name in names:
                ttft_s(client, urls[name], model, prompt_ids(n, 999))
        # the mix once unmeasured: its batch shapes are new to the kernels (FlashInfer JIT-compiles per configuration)
        first = {name: throughput(urls[name], model, mix_prompts(args.lengths, args.mix, offset=100), args.timeout)
                 for name in names}
        for n in args.lengths:
            for i in range(args.ttft_prompts):
                for name in alternating(names, i):
                    ttft[name][str(n)].append(round(ttft_s(client, urls[name], model, prompt_ids(n, i)), 5))
        for turn in range(2):
            for name in alternating(names, turn):
                runs[name].append(throughput(urls[name], model, mix_prompts(args.lengths, args.mix), args.timeout))
        greedy = {name: {str(n): greedy_tokens(client, urls[name], model, prompt_ids(n, 500), args.greedy_tokens)
                         for n in args.lengths} for name in names}
    return {name: {"ttft_s": ttft[name], "ttft_median_s": {n: statistics.median(v) for n, v in ttft[name].items()},
                   "throughput_first": first[name], "throughput_runs": runs[name],
                   "throughput": pooled(runs[name]), "greedy_tokens": greedy[name]} for name in names}


def pooled(runs: list[dict]) -> dict:
    tokens, wall = sum(r["prompt_tokens"] for r in runs), sum(r["wall_s"] for r in runs)
    return {"prompt_tokens": tokens, "wall_s": round(wall, 4), "prefill_tok_per_s": round(tokens / wall, 1)}


def median_ratio_ci(default_s: list[float], tuned_s: list[float], *, reps: int = 4000, seed: int = 0) -> list[float]:
    """95 % bootstrap interval of median(default) / median(tuned): each sample set resampled with replacement.
    The H200 run of 2026-12-02 showed why it is needed: 10 TTFTs of a 32k prompt spread 95-129 ms on one server."""
    from hybridserve.core.bench.median_ratio import median_ratio_interval

    low, high = median_ratio_interval(default_s, tuned_s, resamples=reps, seed=seed)
    return [round(low, 4), round(high, 4)]


def compare(default: dict, tuned: dict) -> dict:
    """Ratios default / tuned (> 1: the tuned profile is faster) and token identity per length; with the TTFT samples
    (`ttft_s`), each ratio's 95 % interval and the lengths where the tuned server is slower beyond it."""
    ttft = {n: round(default["ttft_median_s"][n] / tuned["ttft_median_s"][n], 4) for n in default["ttft_median_s"]}
    report = {
        "ttft_speedup": ttft,
        "ttft_never_slower": all(r >= 1.0 for r in ttft.values()),
        "prefill_throughput_ratio": round(tuned["throughput"]["prefill_tok_per_s"]
                                          / default["throughput"]["prefill_tok_per_s"], 4),
        "greedy_identical": {n: default["greedy_tokens"][n] == tuned["greedy_tokens"][n]
                             for n in default["greedy_tokens"]},
    }
    if "ttft_s" in default and "ttft_s" in tuned:
        ci = {n: median_ratio_ci(default["ttft_s"][n], tuned["ttft_s"][n]) for n in ttft}
        report["ttft_speedup_ci95"] = ci
        report["ttft_slower_beyond_noise"] = [n for n, (_, high) in ci.items() if high < 1.0]
    return report


def bucket_lines(log_text: str) -> list[str]:
    return [line[line.index(LOG_MARK):] for line in log_text.splitlines() if LOG_MARK in line]


def serve_and_measure(configs: dict, args: argparse.Namespace) -> tuple[dict, dict[str, list[str]]]:
    """Start every configuration's server (one after the other: each measures free memory at start), measure them
    side by side, stop them; the results and each server's plugin bucket lines."""
    from contextlib import ExitStack

    from hybridserve.core.launch.machine import machine_plan
    from hybridserve.core.launch.launch_plan import Role
    from hybridserve.core.supervise.runner import started

    urls, logs = {}, {}
    with ExitStack() as stack:
        for name, topology in configs.items():
            print(f"[served_tuned_profile] {name}: starting", file=sys.stderr, flush=True)
            # as launch plans it: the installed vLLM's command line, on CUDA the GPU's memory and name
            plan = machine_plan(topology, Role.SINGLE)
            for warning in plan.warnings:
                print(f"[served_tuned_profile] {warning}", file=sys.stderr, flush=True)
            stack.enter_context(started(plan, args.run_dir / name, timeout_s=args.start_timeout))
            urls[name] = plan.commands[0].url
            logs[name] = args.run_dir / name / f"{plan.commands[0].name}.log"
        print("[served_tuned_profile] measuring, alternating between " + ", ".join(urls), file=sys.stderr, flush=True)
        results = measure(urls, next(iter(configs.values())).served_model_name, args)
    return results, {name: bucket_lines(path.read_text(errors="replace")) for name, path in logs.items()}


def topologies(args: argparse.Namespace):
    from hybridserve.core.launch.topology import Device, EngineOptions, Topology, local_topology
    from hybridserve.core.launch.tuned import apply_tuned_profile, check_tuned_profile, read_header

    device = Device.parse(args.device)
    # on CUDA launch's own sequence cap (the state blocks the share holds), as a user of launch gets it; the CPU
    # smoke run keeps a small one
    engine = EngineOptions(max_model_len=max(args.lengths) + 64, gpu_memory_utilization=args.gpu_share,
                           max_num_seqs=None if device is Device.CUDA else max(8, sum(args.mix)))
    served = _servable(args.model, device)
    # the wrapped form is the multimodal class: vLLM 0.26 needs --language-model-only to skip the vision side (as
    # launch's placement.py passes)
    wrapped = ("--language-model-only",) if served != args.model else ()
    header = read_header(args.profile)
    check_tuned_profile(header, device)

    def single(base_port: int, core: int) -> Topology:
        base = local_topology(model=served, device=device, engine=engine, num_cores=1, base_port=base_port)
        # both servers on the same GPUs (CUDA), or on a core each (CPU: two servers sharing cores crawl)
        devices = tuple(range(args.tp)) if device is Device.CUDA else (core,)
        instance = replace(base.decode[0], tp=args.tp, devices=devices, extra_args=wrapped + tuple(args.extra_arg))
        return replace(base, decode=(instance,), served_model_name=args.model.name)

    configs = {"default": single(args.base_port, 0),
               "tuned": apply_tuned_profile(single(args.base_port + 10, 1), header)}
    if args.control:  # the default again (on CPU beside the default on its core: a smoke run only)
        configs["control"] = single(args.base_port + 20, 0)
    return configs


def _servable(model: Path, device) -> Path:  # noqa: ANN001
    """vLLM 0.26 loads a text-only Qwen3.5 only in the Qwen3_5Config form; launch's converter makes it if present."""
    if device.value != "cuda":
        return model
    try:
        from hybridserve.core.host.model_form import ensure_wrapped, needs_wrapper, wrapped_dir
    except ImportError:
        return model  # this tree has no converter: serve the folder as it is
    return ensure_wrapped(model, wrapped_dir(model)) if needs_wrapper(model) else model


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--profile", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 8192, 32768])
    parser.add_argument("--mix", type=int, nargs="+", default=[16, 4, 1], help="prompts per length in the mix")
    parser.add_argument("--ttft-prompts", type=int, default=30)
    parser.add_argument("--greedy-tokens", type=int, default=32)
    parser.add_argument("--gpu-share", type=float, default=0.4, help="CUDA: --gpu-memory-utilization of each server")
    parser.add_argument("--control", action="store_true",
                        help="also serve a second copy of the default: default / control is the run's A/A ratio")
    parser.add_argument("--extra-arg", action="append", default=[], help="extra vLLM flag (repeat)")
    parser.add_argument("--base-port", type=int, default=8000)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--start-timeout", type=float, default=900.0)
    parser.add_argument("--run-dir", type=Path, default=Path("runs/served_tuned_profile"))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if len(args.mix) != len(args.lengths):
        raise SystemExit("--mix: accepted: one count per --lengths value")
    results, logs = serve_and_measure(topologies(args), args)
    report = {"model": str(args.model), "profile": str(args.profile), "tp": args.tp, "lengths": args.lengths,
              "mix": args.mix, "order": "all servers at once, the request order rotating", "results": results,
              "plugin_bucket_lines": logs,
              "comparison": compare(results["default"], results["tuned"])}
    if "control" in results:
        report["control_comparison"] = compare(results["default"], results["control"])
    from hybridserve.core.common.atomic_file import write_text

    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_text(args.out, json.dumps(report, indent=2))
    print(json.dumps(report["comparison"], indent=2))


if __name__ == "__main__":
    main(sys.argv[1:])
