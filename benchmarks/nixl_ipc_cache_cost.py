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
        [--layout one separate carved] [--regions 15] [--peer first later] [--setting pinned] [--device cpu]

Why the runs of 2026-12-04 saw no cost at 1 region, and which peer to measure (UCX 1.23.0-dev inside nixl 1.5.1,
src/uct/cuda/cuda_ipc, read for issue 38): with the cache off, cuda_ipc opens a remote allocation when a READ's
descriptor first touches it and closes it when its copies complete, so a READ opens each allocation it reads (not each
descriptor). One exception: the first remote key a process ever unpacks is opened for UCX's reachability check and
stays open until that agent is removed. So an initiator's first peer has one allocation open for free (all of
`one` and `carved`, 1 of 15 `separate`), and a later peer (vLLM's decode after prefill's restart, or its second
prefill) has none. `--peer later` first adds a decoy target (1 MiB, never read) to take that key.

`--setting`:
- cache_on: UCX's default; cache_off: `UCX_CUDA_IPC_CACHE=n` (launch's decode);
- pinned: the cache off, and the initiator holds a NIXL memory view (`prep_mem_view`) over one byte at each remote
  region's base, as the plugin's peer_pin does on decode: each allocation is opened once, when the view is made,
  and stays open until the view is released (its time is `pin_ms`).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time

from _nixl_raw import BASE_ENV, raw_agent

SETTINGS = {"cache_on": {}, "cache_off": {"UCX_CUDA_IPC_CACHE": "n"}, "pinned": {"UCX_CUDA_IPC_CACHE": "n"}}
PEERS = ("first", "later")
DECOY_BYTES = 1 << 20
PIN_BYTES = 1  # the plugin's view: one byte at each region's base opens the whole allocation behind it
WARMUP = 2
LAYOUTS = ("one", "separate", "carved")


def target(conn, env: dict, device: str, read_bytes: int, layout: str, regions: int,  # noqa: ANN001
           name: str = "target") -> None:
    import torch

    agent = raw_agent(name, env, device)
    size = 4 * read_bytes // regions
    if layout == "separate":  # an allocation a region: vLLM's KV cache tensors
        bufs = [torch.full((size,), 7, dtype=torch.uint8, device=device) for _ in range(regions)]
    else:  # one allocation, `regions` regions of it (one: a single region)
        whole = torch.full((size * regions,), 7, dtype=torch.uint8, device=device)
        bufs = [whole[r * size:(r + 1) * size] for r in range(regions)]
    agent.register_memory(bufs)
    conn.send((agent.get_agent_metadata(), [b.data_ptr() for b in bufs], size))
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
              read_bytes: int, is_pinned: bool) -> None:
    import numpy as np
    import torch

    agent = raw_agent("initiator", env, device)
    kind = "VRAM" if device == "cuda" else "DRAM"
    buf = torch.zeros(4 * read_bytes, dtype=torch.uint8, device=device)
    agent.register_memory(buf)
    peers = conn.recv()  # [(metadata, region bases, region bytes)]: a decoy first for --peer later, then the target
    names = [agent.add_remote_agent(meta) for meta, _, _ in peers]
    name, (_, remote_bases, _) = names[-1], peers[-1]
    out: dict = {}
    view = None
    if is_pinned:
        t0 = time.perf_counter()
        try:
            view = agent.prep_mem_view(agent.get_remote_descs([(b, PIN_BYTES, 0, name) for b in remote_bases], kind))
            out["pin_ms"] = round(1e3 * (time.perf_counter() - t0), 3)
        except Exception as exc:  # noqa: BLE001 (the plugin then reads unpinned: measure that, say why)
            out["pin_error"] = f"{type(exc).__name__}: {exc}"
    # the local side mirrors the remote regions inside its one buffer (a local region costs no IPC open)
    local_bases = [buf.data_ptr() + r * (4 * read_bytes // len(remote_bases)) for r in range(len(remote_bases))]
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
    if view is not None:
        agent.release_mem_view(view)
    conn.send(out)


def run(setting: str, device: str, counts: list[int], repeats: int, read_bytes: int, layout: str,
        regions: int, peer: str = "first") -> dict:
    ctx = mp.get_context("spawn")
    env = SETTINGS[setting]
    i_conn, i_child = ctx.Pipe()
    targets = []  # (pipe, process): the decoy first (--peer later), the measured target last
    if peer == "later":
        d_conn, d_child = ctx.Pipe()
        targets.append((d_conn, ctx.Process(target=target, args=(d_child, env, device, DECOY_BYTES // 4, "one", 1,
                                                                  "decoy"), daemon=True)))
    t_conn, t_child = ctx.Pipe()
    targets.append((t_conn, ctx.Process(target=target, args=(t_child, env, device, read_bytes, layout, regions),
                                        daemon=True)))
    iproc = ctx.Process(target=initiator, args=(i_child, env, device, counts, repeats, read_bytes,
                                                setting == "pinned"), daemon=True)
    for _, proc in targets:
        proc.start()
    iproc.start()
    if all(conn.poll(120) for conn, _ in targets):
        i_conn.send([conn.recv() for conn, _ in targets])
        result = i_conn.recv() if i_conn.poll(240) else {"error": "no answer in 240 s"}
    else:
        result = {"error": "a target did not register its memory in 120 s"}
    for conn, _ in targets:
        conn.send("done")
    for proc in (iproc, *(p for _, p in targets)):
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
    parser.add_argument("--regions", type=int, nargs="+", default=[15],
                        help="regions of the separate and carved layouts (each count its own run)")
    parser.add_argument("--peer", nargs="+", default=["first"], choices=list(PEERS),
                        help="later: a decoy peer is added first (see the docstring)")
    args = parser.parse_args()
    read_bytes = args.read_mib << 20
    out: dict = {"read_bytes": read_bytes, "env": BASE_ENV, "repeats": args.repeats, "regions": args.regions}
    settings = args.setting or ["cache_on", "cache_off"]
    for layout in args.layout:
        for regions in ([1] if layout == "one" else args.regions):
            for peer in args.peer:
                for setting in settings:
                    key = "/".join(str(k) for k in (layout, regions if layout != "one" else None, peer, setting)
                                   if k is not None)
                    try:
                        out[key] = run(setting, args.device, args.descriptors, args.repeats, read_bytes, layout,
                                       regions, peer)
                    except Exception as exc:  # noqa: BLE001 (one run's failure must not lose the others' numbers)
                        out[key] = {"error": f"{type(exc).__name__}: {exc}"}
                    print(json.dumps({key: out[key]}), flush=True, file=sys.stderr)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
