"""`launch --tuned-profile` against vLLM's default GDN prefill, in one run: TTFT of 1k prompts (and of every length
of the mix), prefill throughput of a 1k/8k/32k mix, and whether the greedy tokens are identical. JSON out.

Usage (H200, vLLM 0.26; the model from scripts/make_gdn_bench_model.py):
    python benchmarks/tuned_serving.py --model /tmp/gdn-tp2 --profile profiles/tuned/h200.yaml --device cuda \
        --out $OUT/tuned_serving.json
On CPU (a smoke run with the tiny model): --device cpu --lengths 64 256 512 --mix 4 2 1 --ttft-prompts 3.

Each configuration is one plain vLLM server (launch's Role.SINGLE), started, warmed up with one prompt of each
length, measured, stopped; the tuned one differs only by `--tuned-profile` (the plugin routes each prefill batch,
and on CUDA `--gdn-prefill-backend` is its closest setting). TTFT is measured with streaming (time to the first
streamed token), one request at a time. Throughput: the whole mix sent at once, max_tokens=1, prompt tokens / wall
time. Greedy: `--greedy-tokens` tokens of one prompt per length, temperature 0.
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


def measure(url: str, model: str, args: argparse.Namespace) -> dict:
    import httpx

    with httpx.Client(timeout=args.timeout) as client:
        for n in args.lengths:  # warm-up: first-call compilation of every kernel shape class
            ttft_s(client, url, model, prompt_ids(n, 999))
        ttft = {str(n): [round(ttft_s(client, url, model, prompt_ids(n, i)), 5) for i in range(args.ttft_prompts)]
                for n in args.lengths}
        greedy = {str(n): greedy_tokens(client, url, model, prompt_ids(n, 500), args.greedy_tokens)
                  for n in args.lengths}
    return {"ttft_s": ttft, "ttft_median_s": {n: statistics.median(v) for n, v in ttft.items()},
            # the mix once unmeasured first: its batch shapes are new to the kernels (FlashInfer JIT-compiles per
            # configuration, and its cache on disk would favour whichever server runs second)
            "throughput_first": throughput(url, model, mix_prompts(args.lengths, args.mix, offset=100), args.timeout),
            "throughput": throughput(url, model, mix_prompts(args.lengths, args.mix), args.timeout),
            "greedy_tokens": greedy}


def compare(default: dict, tuned: dict) -> dict:
    """Ratios default / tuned (> 1: the tuned profile is faster) and token identity per length."""
    ttft = {n: round(default["ttft_median_s"][n] / tuned["ttft_median_s"][n], 4) for n in default["ttft_median_s"]}
    return {
        "ttft_speedup": ttft,
        "ttft_never_slower": all(r >= 1.0 for r in ttft.values()),
        "prefill_throughput_ratio": round(tuned["throughput"]["prefill_tok_per_s"]
                                          / default["throughput"]["prefill_tok_per_s"], 4),
        "greedy_identical": {n: default["greedy_tokens"][n] == tuned["greedy_tokens"][n]
                             for n in default["greedy_tokens"]},
    }


def bucket_lines(log_text: str) -> list[str]:
    return [line[line.index(LOG_MARK):] for line in log_text.splitlines() if LOG_MARK in line]


def serve_and_measure(topology, run_dir: Path, args: argparse.Namespace) -> tuple[dict, str]:
    from hybridserve.core.launch.plan import Role, make_launch_plan
    from hybridserve.core.launch.runner import started

    plan = make_launch_plan(topology, Role.SINGLE)
    with started(plan, run_dir, timeout_s=args.start_timeout):
        result = measure(plan.commands[0].url, topology.model_name, args)
    return result, (run_dir / f"{plan.commands[0].name}.log").read_text(errors="replace")


def topologies(args: argparse.Namespace):
    from hybridserve.core.launch.topology import Device, EngineOptions, local_topology
    from hybridserve.core.launch.tuned import apply_tuned_profile, check_tuned_profile, read_header

    device = Device.parse(args.device)
    engine = EngineOptions(max_model_len=max(args.lengths) + 64, max_num_seqs=max(8, sum(args.mix)))
    served = _servable(args.model, device)
    # the wrapped form is the multimodal class: vLLM 0.26 needs --language-model-only to skip the vision side (as
    # launch's placement.py passes)
    wrapped = ("--language-model-only",) if served != args.model else ()
    base = local_topology(model=served, device=device, engine=engine, num_cores=1, base_port=args.base_port)
    single = replace(base.decode[0], tp=args.tp, devices=tuple(range(args.tp)) if device is Device.CUDA else None,
                     extra_args=wrapped + tuple(args.extra_arg))
    base = replace(base, decode=(single,), served_model_name=args.model.name)
    header = read_header(args.profile)
    check_tuned_profile(header, device)
    return {"default": base, "tuned": apply_tuned_profile(base, header)}


def _servable(model: Path, device) -> Path:  # noqa: ANN001
    """vLLM 0.26 loads a text-only Qwen3.5 only in the Qwen3_5Config form; launch's converter makes it if present."""
    if device.value != "cuda":
        return model
    try:
        from hybridserve.core.launch.model_form import ensure_wrapped, needs_wrapper, wrapped_dir
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
    parser.add_argument("--ttft-prompts", type=int, default=8)
    parser.add_argument("--greedy-tokens", type=int, default=32)
    parser.add_argument("--order", default="default,tuned", help="which configuration runs first")
    parser.add_argument("--extra-arg", action="append", default=[], help="extra vLLM flag (repeat)")
    parser.add_argument("--base-port", type=int, default=8000)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--start-timeout", type=float, default=900.0)
    parser.add_argument("--run-dir", type=Path, default=Path("runs/tuned_serving"))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if len(args.mix) != len(args.lengths):
        raise SystemExit("--mix: accepted: one count per --lengths value")
    configs = topologies(args)
    results, logs = {}, {}
    for name in args.order.split(","):
        print(f"[tuned_serving] {name}: starting", file=sys.stderr, flush=True)
        results[name], log = serve_and_measure(configs[name], args.run_dir / name, args)
        logs[name] = bucket_lines(log)
    report = {"model": str(args.model), "profile": str(args.profile), "tp": args.tp, "lengths": args.lengths,
              "mix": args.mix, "order": args.order, "results": results, "plugin_bucket_lines": logs,
              "comparison": compare(results["default"], results["tuned"])}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=2))
    tmp.rename(args.out)
    print(json.dumps(report["comparison"], indent=2))


if __name__ == "__main__":
    main(sys.argv[1:])
