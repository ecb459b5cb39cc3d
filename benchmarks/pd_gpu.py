"""On a CUDA host: `hybridserve launch --role all --device cuda` with the trained tiny model, requests through the
proxy, then the same requests to one plain server (`launch --role single`). Time to first token for both; per
request, the decode side's NIXL stats (vLLM's /metrics: vllm:nixl_xfer_time_seconds etc.), the plugin's
"NIXL received" log lines and the transport from UCX's protocol report in decode's log.

    python3 benchmarks/pd_gpu.py --out $OUT [--requests 16] [-- extra launch flags]

Writes pd_gpu.json (numbers) and pd_gpu_logs.txt (the decode log's NIXL / UCX lines, the tails of every log).
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from hybridserve.core.common.ucx import fallback_message, parse_proto_info, rma_transport
from hybridserve.core.launch.process import stop_group
from hybridserve.core.validate.dataset import is_correct, load_dataset
from hybridserve.core.vllm_plugin.transfer_log import RECEIVED_LOG_PREFIX

CLI = [sys.executable, "-c", "from hybridserve.cli.app import main; main()"]
NIXL_METRICS = ("vllm:nixl_xfer_time_seconds", "vllm:nixl_post_time_seconds", "vllm:nixl_bytes_transferred",
                "vllm:nixl_num_descriptors", "vllm:nixl_num_failed_transfers")


def start(role: str, base_port: int, run_dir: Path, extra: list[str], log: Path) -> subprocess.Popen:
    argv = CLI + ["launch", "--role", role, "--device", "cuda", "--base-port", str(base_port),
                  "--run-dir", str(run_dir), *extra]
    print("$", " ".join(argv[3:]), flush=True)
    return subprocess.Popen(argv, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)


def wait_health(url: str, proc: subprocess.Popen, timeout_s: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if proc.poll() is not None:
            raise RuntimeError(f"launch exited with {proc.returncode} before {url} was healthy")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return time.monotonic() - t0
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise RuntimeError(f"{url} not healthy after {timeout_s} s")


def stop(proc: subprocess.Popen) -> None:
    stop_group(proc, sig=signal.SIGINT, grace_s=60)


def ask(url: str, model: str, prompt: str, max_tokens: int) -> dict:
    """One streamed completion: time to the first text chunk and to the end."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    t0 = time.perf_counter()
    ttft, text = None, ""
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            piece = chunk["choices"][0].get("text", "")
            if piece and ttft is None:
                ttft = time.perf_counter() - t0
            text += piece
    return {"ttft_s": ttft, "latency_s": time.perf_counter() - t0, "text": text}


def serve_and_measure(url: str, model: str, prompts: list, max_tokens: int) -> dict:
    ask(url, model, prompts[0].prompt, max_tokens)  # warm-up (first GDN/attention kernels)
    rows = [ask(url, model, e.prompt, max_tokens) for e in prompts]
    for row, example in zip(rows, prompts):
        row["correct"] = is_correct(example, row["text"])
    ttft = [r["ttft_s"] for r in rows if r["ttft_s"] is not None]
    correct = sum(1 for r in rows if r["correct"])
    return {"num_requests": len(rows), "ttft_median_s": statistics.median(ttft), "ttft_min_s": min(ttft),
            "ttft_max_s": max(ttft), "latency_median_s": statistics.median(r["latency_s"] for r in rows),
            "num_correct": correct, "texts": [r["text"] for r in rows[:4]]}


def nixl_metrics(url: str) -> dict:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    out = {}
    for name in NIXL_METRICS:
        for suffix in ("_sum", "_count", "_total", ""):
            for m in re.finditer(rf"^{re.escape(name + suffix)}(\{{[^}}]*\}})? ([0-9.eE+-]+)$", text, re.M):
                out[name + suffix] = out.get(name + suffix, 0.0) + float(m.group(2))
    count = out.get("vllm:nixl_xfer_time_seconds_count")
    if count:
        out["mean_xfer_ms"] = 1e3 * out["vllm:nixl_xfer_time_seconds_sum"] / count
        out["mean_post_ms"] = 1e3 * out.get("vllm:nixl_post_time_seconds_sum", 0.0) / count
        if "vllm:nixl_bytes_transferred_sum" in out:
            out["mean_mb"] = out["vllm:nixl_bytes_transferred_sum"] / count / 1e6
    return out


def log_findings(run_root: Path) -> tuple[dict, str]:
    decode = sorted(run_root.glob("*/decode-0.log"))
    if not decode:
        return {"decode_log": None}, ""
    text = decode[-1].read_text(errors="replace")
    received = [line for line in text.splitlines() if RECEIVED_LOG_PREFIX in line]
    tables = parse_proto_info(text)
    transport = rma_transport(tables, memory="cuda")
    keep = [line for line in text.splitlines() if RECEIVED_LOG_PREFIX in line or "|" in line
            or re.search(r"KV Transfer metrics|nixl|NIXL|UCX|ucx|error|Error", line)]
    findings = {"decode_log": str(decode[-1]), "num_received_lines": len(received),
                "received_first": received[:2], "ucx_tables": [(s.header, s.transports) for s in tables],
                "transport_cuda_rma": transport.value if transport else None,
                "tcp_fallback": fallback_message("decode-0", tables)}
    return findings, "\n".join(keep[-400:])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=400)
    parser.add_argument("extra", nargs="*", help="more launch flags (after --)")
    args = parser.parse_args()
    model_dir = Path(__file__).resolve().parent.parent / "profiles" / "tiny-qwen3.5-recall"
    extra = ["--model", str(model_dir), "--enforce-eager", *args.extra]
    prompts = list(load_dataset("synthetic", num_prompts=args.requests, seed=5).examples)
    run_root = Path("/tmp/hs-pd-runs")
    result: dict = {"extra": extra}
    logs = ""
    try:
        proc = start("all", 8000, run_root, extra, run_root.with_suffix(".all.out"))
        try:
            result["pd_start_s"] = wait_health("http://127.0.0.1:8000", proc, args.timeout)
            result["pd"] = serve_and_measure("http://127.0.0.1:8000", model_dir.name, prompts, args.max_tokens)
            result["pd_nixl"] = nixl_metrics("http://127.0.0.1:8200")
            time.sleep(6)  # the launch's transport watch looks every 5 s
        finally:
            stop(proc)
        result["pd_findings"], logs = log_findings(run_root)
        proc = start("single", 9000, run_root, extra, run_root.with_suffix(".single.out"))
        try:
            result["single_start_s"] = wait_health("http://127.0.0.1:9200", proc, args.timeout)
            result["single"] = serve_and_measure("http://127.0.0.1:9200", model_dir.name, prompts, args.max_tokens)
        finally:
            stop(proc)
    except Exception as exc:  # keep what was measured
        result["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        tails = []
        for path in sorted(run_root.parent.glob(run_root.name + "*.out")) + sorted(run_root.glob("*/*.log")):
            lines = path.read_text(errors="replace").splitlines()
            tails.append(f"===== {path} (last 60 of {len(lines)} lines)\n" + "\n".join(lines[-60:]))
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "pd_gpu.json").write_text(json.dumps(result, indent=1, default=str))
        (args.out / "pd_gpu_logs.txt").write_text(logs + "\n\n" + "\n\n".join(tails))
    print(json.dumps({k: v for k, v in result.items() if k not in ("pd_findings",)}, indent=1, default=str))
    print(json.dumps(result.get("pd_findings", {}), default=str)[:3000])


if __name__ == "__main__":
    main()
