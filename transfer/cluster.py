"""Prefill and decode ranks of one host as processes, set up for a plan and moving requests between them."""

from __future__ import annotations

from typing import Any

from hybridserve.core.layout.descriptors import Scheme
from hybridserve.core.layout.plan import Plan
from hybridserve.transfer.geometry import RequestBlocks, read_ranks
from hybridserve.transfer.rank import RankGroup, RankProcess
from hybridserve.transfer.regions import prefill_seed
from hybridserve.transfer.ucx_capture import UcxCapture

PREFILL_SEED, DECODE_SEED = 1000, 2000


class Cluster:
    """`with Cluster(2, 1) as c: c.setup(plan, num_blocks); c.move(blocks, Scheme.OURS, "r1")`."""

    def __init__(self, prefill_tp: int, decode_tp: int, *, device: str = "cpu", telemetry: bool = True,
                 wait_s: float = 120.0, num_threads: int = 0, capture: UcxCapture | None = None) -> None:
        self.group = RankGroup()
        self.wait_s = wait_s

        def extra(role: str, rank: int) -> dict[str, Any]:  # environment + stdout file, when UCX is watched
            return capture.options(role, rank) if capture else {}

        self.prefill: list[RankProcess] = [self.group.start("prefill", p, device=device, **extra("prefill", p))
                                           for p in range(prefill_tp)]
        self.decode: list[RankProcess] = [self.group.start("decode", d, device=device, telemetry=telemetry,
                                                          num_threads=num_threads, **extra("decode", d))
                                          for d in range(decode_tp)]
        self.plan: Plan | None = None

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.group.__exit__(*exc)

    def _all(self, ranks: list[RankProcess], cmd: str, each: list[dict[str, Any]]) -> list[Any]:
        for proc, kwargs in zip(ranks, each, strict=True):
            proc.send(cmd, **kwargs)
        return [proc.result(self.wait_s) for proc in ranks]

    @property
    def prefill_seeds(self) -> list[int]:
        return [prefill_seed(self.plan.prefill, p, PREFILL_SEED) for p in range(len(self.prefill))]

    def setup(self, plan: Plan, num_blocks: int, *, connect_timeout_s: float = 30.0) -> None:
        """Allocate, fill and register every rank's regions, then handshake each decode rank with its peers."""
        self.plan = plan
        infos = self._all(self.prefill, "setup", [dict(layout=plan.prefill, num_blocks=num_blocks, seed=s)
                                                  for s in self.prefill_seeds])
        self._all(self.decode, "setup", [dict(layout=plan.decode, num_blocks=num_blocks, seed=DECODE_SEED + d)
                                         for d in range(len(self.decode))])
        for d, proc in enumerate(self.decode):
            for p in read_ranks(len(self.prefill), len(self.decode), d):
                proc.call("connect", self.wait_s, rank=p, host="127.0.0.1", port=infos[p]["port"],
                          layout=plan.prefill, timeout_s=connect_timeout_s)

    def move(self, blocks: RequestBlocks, scheme: Scheme, request_id: str, *, timeout_s: float = 60.0,
             streams: int = 1) -> list[dict[str, Any]]:
        """Every decode rank READs the request; every prefill rank waits for its notifications."""
        readers = {p: 0 for p in range(len(self.prefill))}
        for d in range(len(self.decode)):
            for p in read_ranks(len(self.prefill), len(self.decode), d):
                readers[p] += 1
        for proc in self.decode:
            proc.send("read", request_id=request_id, blocks=blocks, scheme=scheme, timeout_s=timeout_s,
                      streams=streams)
        waiting = [(self.prefill[p], n) for p, n in readers.items() if n]
        for proc, n in waiting:
            proc.send("await_reads", request_id=request_id, expected=n, timeout_s=timeout_s)
        results = [proc.result(timeout_s + self.wait_s) for proc in self.decode]
        for proc, _ in waiting:
            proc.result(timeout_s + self.wait_s)
        return results

    def check(self, blocks: RequestBlocks, scheme: Scheme) -> list[dict[str, Any]]:
        return self._all(self.decode, "check", [dict(blocks=blocks, scheme=scheme, prefill_seeds=self.prefill_seeds)
                                                for _ in self.decode])

    def copy_baseline(self, num_bytes: int) -> float:
        return self.decode[0].call("copy_baseline", self.wait_s, num_bytes=num_bytes)

    def flush_stdout(self) -> None:
        """Make every rank write out what UCX has printed so far."""
        self._all(self.prefill + self.decode, "flush_stdout", [{} for _ in self.prefill + self.decode])
