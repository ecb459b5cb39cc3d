"""What a rank process does: a prefill rank serves its pages, a decode rank READs them and checks the bytes."""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

from hybridserve.core.layout.descriptors import Scheme
from hybridserve.core.layout.rank_layout import RankLayout
from hybridserve.transfer import descriptors_ours, descriptors_vllm
from hybridserve.transfer.agent import DEFAULT_PROGRESS_DELAY_US, Agent
from hybridserve.transfer.errors import TransferError
from hybridserve.transfer.geometry import RequestBlocks, Side
from hybridserve.transfer.handshake import Compat, PeerInfo, SideChannel, connect_peer
from hybridserve.transfer.regions import Regions, allocate
from hybridserve.transfer.verify import check_request
from hybridserve.transfer.xfer import read_request, wait_notifications

BUILDERS = {Scheme.VLLM: descriptors_vllm.build, Scheme.OURS: descriptors_ours.build}


class _Worker:
    def __init__(self, rank: int, *, device: str = "cpu", progress_delay_us: int | None = DEFAULT_PROGRESS_DELAY_US,
                 telemetry: bool = False, num_threads: int = 0) -> None:
        self.rank, self.device, self.delay, self.telemetry = rank, device, progress_delay_us, telemetry
        self.num_threads = num_threads
        self.regions: Regions | None = None
        self.agent: Agent | None = None

    def close(self) -> None:
        if self.agent is not None:
            self.agent.close()
        self.agent = self.regions = None

    def flush_stdout(self) -> None:
        """Flush C stdio (UCX's protocol report is buffered when stdout is a file)."""
        import ctypes

        ctypes.CDLL(None).fflush(None)


class PrefillWorker(_Worker):
    channel: SideChannel | None = None

    def setup(self, *, layout: RankLayout, num_blocks: int, seed: int, register: bool = True) -> dict[str, Any]:
        self.close()
        self.regions = allocate(layout, self.rank, num_blocks, seed=seed, device=self.device)
        self.agent = Agent(role="prefill", rank=self.rank, progress_delay_us=self.delay)
        if register:
            self.agent.register(self.regions.tensors)
        agent, regions = self.agent, self.regions
        self.channel = SideChannel(lambda: PeerInfo(
            agent_name=agent.name, agent_metadata=agent.nixl.get_agent_metadata(),
            compat=asdict(Compat.of(layout)), regions=tuple(regions.rows()), num_blocks=num_blocks, mem=regions.mem))
        return {"port": self.channel.port, "agent": agent.name}

    def await_reads(self, *, request_id: str, expected: int, timeout_s: float) -> list[str]:
        return wait_notifications(self.agent, request_id, expected, timeout_s=timeout_s)

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        super().close()


class DecodeWorker(_Worker):
    def setup(self, *, layout: RankLayout, num_blocks: int, seed: int) -> dict[str, Any]:
        self.close()
        self.regions = allocate(layout, self.rank, num_blocks, seed=seed, device=self.device)
        self.agent = Agent(role="decode", rank=self.rank, progress_delay_us=self.delay, telemetry=self.telemetry,
                           num_threads=self.num_threads)
        self.agent.register(self.regions.tensors)
        self.peers: dict[int, tuple[str, int, Side]] = {}
        return {"agent": self.agent.name}

    def connect(self, *, rank: int, host: str, port: int, layout: RankLayout, timeout_s: float) -> str:
        """Handshake with prefill rank `rank` (whose plan is `layout`); replaces an earlier peer of that rank."""
        self.forget(rank=rank)
        info, key = connect_peer(self.agent, host, port, expected=Compat.of(layout), timeout_s=timeout_s)
        side = Side(layout=layout, rank=rank, bases=tuple(r[0] for r in info.regions), num_blocks=info.num_blocks,
                    device=info.regions[0][2])
        self.peers[rank] = (info.agent_name, key, side)
        return info.agent_name

    def forget(self, *, rank: int) -> None:
        if rank in self.peers:
            self.agent.release(self.peers.pop(rank)[1])

    def read(self, *, request_id: str, blocks: RequestBlocks, scheme: Scheme, timeout_s: float,
             check_ranges: bool = True, started_path: str | None = None, streams: int = 1) -> dict[str, Any]:
        local = self.regions.side()
        t0 = time.perf_counter()
        reads = BUILDERS[scheme](local, {r: s for r, (_, _, s) in self.peers.items()}, blocks)
        build_s = time.perf_counter() - t0
        local_regions = [(a, n) for a, n, _ in self.regions.rows()]
        remote_regions = {r: [(a, s.region_bytes) for a in s.bases] for r, (_, _, s) in self.peers.items()}
        names = {r: name for r, (name, _, _) in self.peers.items()}
        notif = f"{request_id}:{self.regions.layout.request.tp}".encode()
        try:
            timing = read_request(self.agent, names, reads, mem=self.regions.mem, notif=notif, timeout_s=timeout_s,
                                  local_regions=local_regions if check_ranges else None,
                                  remote_regions=remote_regions if check_ranges else None,
                                  on_post=(lambda: open(started_path, "w").close()) if started_path else None,
                                  streams=streams)
        except TransferError as exc:
            if exc.phase == "transfer":  # the connection is poisoned (NIXL): drop the peer, reconnect later
                for rank, (name, _, _) in list(self.peers.items()):
                    if name == exc.peer:
                        self.forget(rank=rank)
            raise
        return asdict(timing) | {"build_s": build_s, "num_reads": len(reads),
                                 "num_attention": sum(r.num_attention for r in reads),
                                 "num_gdn": sum(r.num_gdn for r in reads)}

    def check(self, *, blocks: RequestBlocks, scheme: Scheme, prefill_seeds: list[int]) -> dict[str, Any]:
        """Check every byte, then put this rank's own pattern back on the request's pages."""
        prefill_layout = next(iter(self.peers.values()))[2].layout
        result = check_request(self.regions, prefill_layout, prefill_seeds, blocks,
                               whole_blocks=scheme is Scheme.VLLM)
        self.regions.fill(blocks=[b for group in blocks.decode for b in group])
        return asdict(result) | {"is_exact": result.is_exact}

    def unchanged(self) -> bool:
        """True when every byte still holds this rank's own pattern."""
        import torch

        from hybridserve.transfer.regions import pattern

        return all(torch.equal(t, pattern(self.regions.seed, j, 0, t.numel(), t.device))
                   for j, t in enumerate(self.regions.tensors))

    def copy_baseline(self, *, num_bytes: int, repeats: int = 3, one_thread: bool = False) -> float:
        """Best time (s) to copy `num_bytes` between two buffers of this rank's memory, in this process
        (torch's copy, which uses every core on a CPU; `one_thread`: numpy's single-threaded memcpy)."""
        import torch

        from hybridserve.transfer.regions import advise_huge_pages

        src, dst = (torch.empty(num_bytes, dtype=torch.uint8, device=self.device) for _ in range(2))
        if not self.device.startswith("cuda"):  # the same pages as the regions get, before the first touch
            advise_huge_pages(src.data_ptr(), num_bytes)
            advise_huge_pages(dst.data_ptr(), num_bytes)
        src.fill_(1)
        dst.zero_()
        copy = (lambda: __import__("numpy").copyto(dst.numpy(), src.numpy())) if one_thread else (
            lambda: dst.copy_(src))
        best = float("inf")
        for _ in range(repeats):
            _sync(self.device)
            t0 = time.perf_counter()
            copy()
            _sync(self.device)
            best = min(best, time.perf_counter() - t0)
        return best


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def make(role: str, rank: int, **options: Any) -> _Worker:
    return PrefillWorker(rank, **options) if role == "prefill" else DecodeWorker(rank, **options)
