"""Measures NIXL READ against WRITE (the direction `launch` and `transfer bench` use); feeds BENCHMARKS.md,
"Transfer" (benchmarks/DETAILS.md, "READ (pull) against WRITE (push), H200").

On a CUDA host: NIXL READ (pull) against WRITE (push) of GPU memory between two processes on one GPU, with
UCX's defaults and with UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y: which direction and setting `launch` should use.

    python3 benchmarks/nixl_read_vs_write.py [--mib 1024] [--descriptors 1 --descriptors 64] > direction.json

Each setting runs in two fresh processes (UCX reads its environment once): a target that registers a buffer and
progresses its agent, an initiator that READs it or WRITEs into it, best of 5, bytes checked after each op.
UCX's protocol report (UCX_PROTO_INFO=y) of the initiator names the transport per setting.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import tempfile
import time

SETTINGS = {"default": {}, "get_zcopy": {"UCX_CUDA_IPC_ENABLE_GET_ZCOPY": "y"}}


def _agent(name: str, env: dict, log: str | None = None):  # noqa: ANN202
    os.environ.update(env, UCX_PROTO_INFO="y", NIXL_LOG_LEVEL="WARN")
    if log:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
    import nixl._api as api

    return api.nixl_agent(name, api.nixl_agent_config(enable_prog_thread=True, backends=["UCX"]))


def target(conn, env: dict, nbytes: int) -> None:  # noqa: ANN001
    import torch

    agent = _agent("target", env)
    buf = torch.full((nbytes,), 7, dtype=torch.uint8, device="cuda")
    agent.register_memory(buf)
    conn.send((agent.get_agent_metadata(), buf.data_ptr()))
    peer = conn.recv()
    agent.add_remote_agent(peer)
    while True:  # progress until told to stop; answer checks of what a WRITE left here
        msg = conn.recv()
        if msg == "stop":
            return
        torch.cuda.synchronize()
        conn.send(float((buf == msg).float().mean().item()))


def initiator(conn, env: dict, nbytes: int, counts: list[int], log: str) -> dict:  # noqa: ANN001
    import numpy as np
    import torch

    agent = _agent("initiator", env, log)
    buf = torch.zeros(nbytes, dtype=torch.uint8, device="cuda")
    agent.register_memory(buf)
    meta, remote_base = conn.recv()
    conn.send(agent.get_agent_metadata())
    name = agent.add_remote_agent(meta)
    out, held = {}, 7  # what the target's buffer holds (7, then the last WRITE's fill)
    for count in counts:
        piece = nbytes // count
        local = np.array([(buf.data_ptr() + i * piece, piece, 0) for i in range(count)], dtype=np.uint64)
        remote = np.array([(remote_base + i * piece, piece, 0) for i in range(count)], dtype=np.uint64)
        for op in ("READ", "WRITE"):
            best, checks, first = float("inf"), [], None
            for rep in range(5):
                fill = 11 + rep
                if op == "WRITE":
                    buf.fill_(fill)
                else:
                    buf.zero_()
                torch.cuda.synchronize()
                handle = agent.initialize_xfer(op, agent.get_xfer_descs(local, "VRAM"),
                                               agent.get_xfer_descs(remote, "VRAM"), name, b"x")
                t0 = time.perf_counter()
                state = agent.transfer(handle)
                first = first or state
                while state == "PROC":
                    state = agent.check_xfer_state(handle)
                elapsed = time.perf_counter() - t0
                agent.release_xfer_handle(handle)
                if state != "DONE":
                    raise RuntimeError(f"{op} ended {state}")
                torch.cuda.synchronize()
                if op == "READ":
                    ok = float((buf == held).float().mean().item())
                else:
                    conn.send(fill)
                    ok = float(conn.recv())
                    held = fill
                checks.append(ok)
                best = min(best, elapsed)
            out[f"{op} x{count}"] = {"ms": 1e3 * best, "gbps": nbytes / best / 1e9,
                                     "fraction_right": min(checks), "first_state": first}
    conn.send("stop")
    return out


def run(setting: str, nbytes: int, counts: list[int]) -> dict:
    ctx = mp.get_context("spawn")
    a, b = ctx.Pipe()
    env = SETTINGS[setting]
    proc = ctx.Process(target=target, args=(b, env, nbytes), daemon=True)
    proc.start()
    log = tempfile.mktemp(suffix=".ucx.log")
    try:
        result = _in_child(ctx, a, env, nbytes, counts, log)
    finally:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
    from hybridserve.core.common.ucx import parse_proto_info

    tables = parse_proto_info(open(log, errors="replace").read()) if os.path.exists(log) else []
    result["ucx"] = [(s.header, s.transports) for s in tables if s.is_rma]
    return result


def _in_child(ctx, conn, env, nbytes, counts, log):  # noqa: ANN001, ANN202
    """The initiator in its own process too (UCX's environment is read once per process)."""
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_initiator_main, args=(conn, child, env, nbytes, counts, log), daemon=True)
    proc.start()
    result = parent.recv()
    proc.join(timeout=30)
    return result


def _initiator_main(conn, report, env, nbytes, counts, log) -> None:  # noqa: ANN001
    try:
        result = initiator(conn, env, nbytes, counts, log)
        import ctypes

        ctypes.CDLL(None).fflush(None)  # UCX's report, buffered in C stdio
        report.send(result)
    except Exception as exc:  # noqa: BLE001
        report.send({"error": f"{type(exc).__name__}: {exc}"})
        conn.send("stop")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--descriptors", type=int, action="append")
    args = parser.parse_args()
    counts = args.descriptors or [1, 60, 1024]
    results = {s: run(s, args.mib * 2**20, counts) for s in SETTINGS}
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
