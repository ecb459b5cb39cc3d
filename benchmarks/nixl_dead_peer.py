"""Whether a NIXL READ initiator keeps a dead target's GPU memory (UCX cuda_ipc), and what gives it back; feeds
BENCHMARKS.md, "A dead engine's GPU memory, held by its NIXL peer (H200)".

On a CUDA host: the chaos bench saw prefill's restart refused by vLLM (17.98 of 139.8 GiB free) after prefill's
SIGKILL, its decode peer listed with prefill's memory as well as its own. This reproduces that without vLLM: a target
registers one GPU buffer, an initiator READs it over cuda_ipc, the target is SIGKILLed, then the initiator removes
the remote agent, then exits; the GPU's used memory after each step, per UCX setting (the cuda_ipc mapping cache on,
UCX's default, and off), with the READ's time for each.

    python3 benchmarks/nixl_dead_peer.py [--gib 8] [--setting default --setting cache_off] [--device cpu] > out.json

Two more settings, for the plugin's peer pin (core/vllm_plugin/peer_pin.py: a decode holds a NIXL memory view over
one byte at each of a live prefill's regions, so that READs with the cache off open nothing):
- pinned: the cache off and the view held from the handshake on; after the SIGKILL the view is released, then the
  remote agent removed (the plugin's order): the memory must come back at `remote_agent_removed`;
- pinned_unreleased: the same, but the agent is removed with the view still held (the control: the view is what
  holds the memory, so it stays held until the initiator exits).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import time

from _nixl_raw import BASE_ENV, raw_agent

SETTINGS = {"default": {}, "cache_off": {"UCX_CUDA_IPC_CACHE": "n"}, "pinned": {"UCX_CUDA_IPC_CACHE": "n"},
            "pinned_unreleased": {"UCX_CUDA_IPC_CACHE": "n"}}
PINNED = ("pinned", "pinned_unreleased")
SETTLE_S = 3.0  # after each step, before the memory is read


def target(conn, env: dict, nbytes: int, device: str) -> None:  # noqa: ANN001
    import torch

    agent = raw_agent("target", env)
    buf = torch.full((nbytes,), 7, dtype=torch.uint8, device=device)
    agent.register_memory(buf)
    conn.send((agent.get_agent_metadata(), buf.data_ptr(), os.getpid()))
    agent.add_remote_agent(conn.recv())
    while True:  # progress until killed
        time.sleep(1)


def initiator(conn, env: dict, nbytes: int, device: str, is_pinned: bool = False) -> None:  # noqa: ANN001
    import numpy as np
    import torch

    agent = raw_agent("initiator", env, device)
    buf = torch.zeros(nbytes, dtype=torch.uint8, device=device)
    kind = "VRAM" if device == "cuda" else "DRAM"
    agent.register_memory(buf)
    meta, remote_base = conn.recv()
    conn.send(agent.get_agent_metadata())
    name = agent.add_remote_agent(meta)
    view, pin = None, {}
    if is_pinned:  # the plugin's view: one byte at the region's base
        t0 = time.perf_counter()
        try:
            view = agent.prep_mem_view(agent.get_remote_descs([(remote_base, 1, 0, name)], kind))
            pin = {"pin_ms": round(1e3 * (time.perf_counter() - t0), 3)}
        except Exception as exc:  # noqa: BLE001 (recorded: the steps below then say what an unpinned reader does)
            pin = {"pin_error": f"{type(exc).__name__}: {exc}"}
    local = agent.get_xfer_descs(np.array([(buf.data_ptr(), nbytes, 0)], dtype=np.uint64), kind)
    remote = agent.get_xfer_descs(np.array([(remote_base, nbytes, 0)], dtype=np.uint64), kind)
    while True:
        msg = conn.recv()
        if msg == "read":
            times, right = [], 0.0
            for _ in range(5):
                buf.zero_()
                _sync(torch)
                handle = agent.initialize_xfer("READ", local, remote, name, b"x")
                t0 = time.perf_counter()
                state = agent.transfer(handle)
                while state == "PROC":
                    state = agent.check_xfer_state(handle)
                times.append(time.perf_counter() - t0)
                agent.release_xfer_handle(handle)
                _sync(torch)
                right = float((buf == 7).float().mean().item()) if state == "DONE" else 0.0
            conn.send({"read_ms": [round(1e3 * t, 3) for t in times], "fraction_right": right, **pin})
        elif msg == "release":
            if view is not None:
                agent.release_mem_view(view)
                view = None
            conn.send("released")
        elif msg == "remove":
            agent.remove_remote_agent(name)
            conn.send("removed")
        elif msg == "exit":
            conn.send("bye")
            return


def _sync(torch) -> None:  # noqa: ANN001
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def gpu_used_mib() -> dict:
    if shutil.which("nvidia-smi") is None:
        return {"gpu_used_mib": None, "per_pid_mib": {}}  # --device cpu: the logic only
    total = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True).stdout.split()
    apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                          capture_output=True, text=True).stdout.strip().splitlines()
    return {"gpu_used_mib": int(total[0]) if total else None,
            "per_pid_mib": {a.split(",")[0].strip(): int(a.split(",")[1]) for a in apps if "," in a}}


def run(setting: str, nbytes: int, device: str) -> dict:
    ctx = mp.get_context("spawn")
    t_conn, t_child = ctx.Pipe()
    i_conn, i_child = ctx.Pipe()
    env = SETTINGS[setting]
    before = gpu_used_mib()
    tproc = ctx.Process(target=target, args=(t_child, env, nbytes, device), daemon=True)
    iproc = ctx.Process(target=initiator, args=(i_child, env, nbytes, device, setting in PINNED), daemon=True)
    tproc.start()
    iproc.start()
    meta, base, tpid = t_conn.recv()
    i_conn.send((meta, base))
    t_conn.send(i_conn.recv())
    steps = {"before": before}
    i_conn.send("read")
    steps["read"] = i_conn.recv()
    time.sleep(SETTLE_S)
    steps["both_alive"] = gpu_used_mib()
    os.kill(tpid, signal.SIGKILL)
    tproc.join(timeout=10)
    time.sleep(SETTLE_S)
    steps["target_killed"] = gpu_used_mib()
    if setting == "pinned":  # the plugin's order: the view first, then the agent (vLLM's _cleanup_remote_engine)
        i_conn.send("release")
        steps["release"] = i_conn.recv() if i_conn.poll(30) else "no answer in 30 s"
    i_conn.send("remove")
    steps["remove"] = i_conn.recv() if i_conn.poll(30) else "no answer in 30 s"
    time.sleep(SETTLE_S)
    steps["remote_agent_removed"] = gpu_used_mib()
    i_conn.send("exit")
    i_conn.poll(30)
    iproc.join(timeout=30)
    if iproc.is_alive():
        iproc.kill()
    time.sleep(SETTLE_S)
    steps["initiator_exited"] = gpu_used_mib()
    steps["initiator_pid"] = iproc.pid
    return steps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gib", type=float, default=8.0)
    parser.add_argument("--setting", action="append", choices=list(SETTINGS))
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: DRAM, to check the steps")
    args = parser.parse_args()
    nbytes = int(args.gib * 2**30)
    out = {"gib": args.gib, "env": BASE_ENV}
    for setting in args.setting or list(SETTINGS):
        try:
            out[setting] = run(setting, nbytes, args.device)
        except Exception as exc:  # noqa: BLE001 (one setting's failure must not lose the other's numbers)
            out[setting] = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps({setting: out[setting]}), flush=True, file=sys.stderr)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
