"""What a READ costs with UCX's cuda_ipc mapping cache off (launch's setting for decode engines on CUDA), by number
of descriptors; feeds BENCHMARKS.md, "A dead engine's GPU memory, held by its NIXL peer (H200)".

Off, a decode gives a dead prefill's memory back once it removes the remote agent (benchmarks/nixl_dead_peer.py). The
question is what it costs a live READ: with the cache off UCX may open the peer's IPC handle for each transfer (or
each descriptor) instead of once. vLLM's decode posts a few hundred descriptors a request (the served 60-layer
model: 195-309, plan's count); this READs 1 GiB (`--read-mib`) of a target's 4 GiB buffer as N equal pieces, every
other piece (so NIXL cannot merge them), prepared once as vLLM prepares them (`prep_xfer_dlist`, `make_prepped_xfer`), and
times each READ from `transfer` to DONE (median of `--repeats`, after 2 warm-ups), per setting, in fresh processes.

`--layout` places the target's memory (its descriptors spread evenly over its regions):
- one: one allocation, one region (the runs of 2026-12-04: no cost from the cache off at 280 descriptors);
- separate: `--regions` allocations, each its own region, as vLLM allocates and registers a hybrid model's KV cache
  (one tensor each: `num_regions=15` for the 60-layer model). Served on 2026-12-05, decode's READ post took 22-30 ms
  with the cache off against 3-6 ms on: expected here, one IPC open per region per READ;
- carved: one allocation holding `--regions` registered regions (one IPC handle behind them all): what a KV cache
  allocated in one piece would cost.

    python3 benchmarks/nixl_ipc_cache_cost.py [--descriptors 1 280 4096] [--repeats 20] [--read-mib 1024]
        [--layout one separate carved] [--regions 15] [--device cpu] > out.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time

SETTINGS = {"cache_on": {}, "cache_off": {"UCX_CUDA_IPC_CACHE": "n"}}
BASE_ENV = {"UCX_CUDA_IPC_ENABLE_GET_ZCOPY": "y", "NIXL_LOG_LEVEL": "WARN"}  # launch's setting for same-host READ
WARMUP = 2
LAYOUTS = ("one", "separate", "carved")


def _agent(name: str, env: dict):  # noqa: ANN202
    os.environ.update(BASE_ENV, **env)
    import nixl._api as api

    return api.nixl_agent(name, api.nixl_agent_config(enable_prog_thread=True, backends=["UCX"]))


def target(conn, env: dict, device: str, read_bytes: int, layout: str, regions: int) -> None:  # noqa: ANN001
    import torch

    agent = _agent("target", env)
    size = 4 * read_bytes // regions
    if layout == "separate":  # an allocation a region: vLLM's KV cache tensors
        bufs = [torch.full((size,), 7, dtype=torch.uint8, device=device) for _ in range(regions)]
    else:  # one allocation, `regions` regions of it (one: a single region)
        whole = torch.full((size * regions,), 7, dtype=torch.uint8, device=device)
        bufs = [whole[r * size:(r + 1) * size] for r in range(regions)]
    agent.register_memory(bufs)
    conn.send((agent.get_agent_metadata(), [b.data_ptr() for b in bufs]))
    conn.recv()  # until the initiator is done


def pieces(base: int, count: int, read_bytes: int) -> list[tuple[int, int]]:
    """`count` pieces of `read_bytes` in all, every other one of 2 * count equal slots: no two are adjacent."""
    size = read_bytes // count
    return [(base + 2 * i * size, size) for i in range(count)]


def spread(bases: list[int], count: int, read_bytes: int) -> list[tuple[int, int]]:
    """`count` pieces spread evenly over the regions at `bases` (at least one a region), `read_bytes` in all."""
    each = max(1, count // len(bases))
    return [piece for base in bases for piece in pieces(base, each, read_bytes // len(bases))]


def initiator(conn, env: dict, device: str, counts: list[int], repeats: int,  # noqa: ANN001
              read_bytes: int, regions: int) -> None:
    import numpy as np
    import torch

    agent = _agent("initiator", env)
    kind = "VRAM" if device == "cuda" else "DRAM"
    buf = torch.zeros(4 * read_bytes, dtype=torch.uint8, device=device)
    agent.register_memory(buf)
    meta, remote_bases = conn.recv()
    name = agent.add_remote_agent(meta)
    # the local side mirrors the remote regions inside its one buffer (a local region costs no IPC open)
    local_bases = [buf.data_ptr() + r * (4 * read_bytes // len(remote_bases)) for r in range(len(remote_bases))]
    out = {}
    for count in counts:
        def dlist(bases: list[int], peer: str):  # noqa: ANN202
            descs = np.array([(a, n, 0) for a, n in spread(bases, count, read_bytes)], dtype=np.uint64)
            return agent.prep_xfer_dlist(peer, descs, kind), len(descs)

        (local, posted), (remote, _) = dlist(local_bases, "NIXL_INIT_AGENT"), dlist(remote_bases, name)
        ids = np.arange(posted)
        times, post = [], []
        for i in range(WARMUP + repeats):
            t0 = time.perf_counter()
            handle = agent.make_prepped_xfer("READ", local, ids, remote, ids, b"x")
            state = agent.transfer(handle)
            t1 = time.perf_counter()
            while state == "PROC":
                state = agent.check_xfer_state(handle)
            t2 = time.perf_counter()
            agent.release_xfer_handle(handle)
            if state != "DONE":
                out[count] = {"error": f"state {state}"}
                break
            if i >= WARMUP:
                post.append(t1 - t0)
                times.append(t2 - t0)
        else:
            base, read = buf.data_ptr(), spread(local_bases, count, read_bytes)
            moved = sum(n for _, n in read)
            right = sum(int((buf[a - base:a - base + n] == 7).sum().item()) for a, n in read) / moved
            median = statistics.median(times)
            out[count] = {"descriptors": posted, "regions": len(remote_bases),
                          "read_ms_median": round(1e3 * median, 3), "read_ms_min": round(1e3 * min(times), 3),
                          "post_ms_median": round(1e3 * statistics.median(post), 3),
                          "gb_s_median": round(moved / median / 1e9, 1), "fraction_right": round(right, 6)}
        agent.release_dlist_handle(local)
        agent.release_dlist_handle(remote)
        buf.zero_()
    conn.send(out)


def run(setting: str, device: str, counts: list[int], repeats: int, read_bytes: int, layout: str,
        regions: int) -> dict:
    ctx = mp.get_context("spawn")
    t_conn, t_child = ctx.Pipe()
    i_conn, i_child = ctx.Pipe()
    env = SETTINGS[setting]
    tproc = ctx.Process(target=target, args=(t_child, env, device, read_bytes, layout, regions), daemon=True)
    iproc = ctx.Process(target=initiator, args=(i_child, env, device, counts, repeats, read_bytes, regions),
                        daemon=True)
    tproc.start()
    iproc.start()
    if t_conn.poll(120):
        i_conn.send(t_conn.recv())
        result = i_conn.recv() if i_conn.poll(240) else {"error": "no answer in 240 s"}
    else:
        result = {"error": "the target did not register its memory in 120 s"}
    t_conn.send("done")
    for proc in (iproc, tproc):
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--descriptors", type=int, nargs="+", default=[1, 280, 4096])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--read-mib", type=int, default=1024, help="bytes a READ moves (the buffers are 4x)")
    parser.add_argument("--setting", action="append", choices=list(SETTINGS))
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: DRAM, to check the steps")
    parser.add_argument("--layout", nargs="+", default=["one"], choices=list(LAYOUTS))
    parser.add_argument("--regions", type=int, default=15, help="regions of the separate and carved layouts")
    args = parser.parse_args()
    read_bytes = args.read_mib << 20
    out: dict = {"read_bytes": read_bytes, "env": BASE_ENV, "repeats": args.repeats, "regions": args.regions}
    for layout in args.layout:
        regions = 1 if layout == "one" else args.regions
        for setting in args.setting or list(SETTINGS):
            key = setting if args.layout == ["one"] else f"{layout}/{setting}"  # one layout: the earlier keys
            try:
                out[key] = run(setting, args.device, args.descriptors, args.repeats, read_bytes, layout, regions)
            except Exception as exc:  # noqa: BLE001 (one setting's failure must not lose the other's numbers)
                out[key] = {"error": f"{type(exc).__name__}: {exc}"}
            print(json.dumps({key: out[key]}), flush=True, file=sys.stderr)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
