"""UCX for same-host VRAM transfers: the environment that keeps them on cuda_ipc, and which transport UCX chose.

Without NVLink between the two processes' GPU (one GPU shared by prefill and decode, or PCIe-only GPUs), UCX
turns cuda_ipc's get_zcopy off, so a NIXL READ from GPU memory falls back to an active-message emulation over
TCP loopback: `rma_am(tcp/lo)` in UCX's protocol report, ~0.5 GB/s on the H200 against ~2,000 GB/s over
cuda_ipc (issue 14). vLLM's NixlConnector and `transfer bench` both READ (pull), so the fix is to enable
get_zcopy rather than switch to WRITE (push) (BENCHMARKS.md compares the two on the H200).

The report is what UCX prints with `UCX_PROTO_INFO=y`: a table per (operation, memory type) whose header says
e.g. "remote memory read by ucp_get* from cuda memory" and whose rows name the transports as `tl/device`
(`cuda_ipc/cuda`, `tcp/lo`, `cma/memory`), sometimes wrapped in a scheme (`rma_am(tcp/lo)`).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

GET_ZCOPY_ENV = "UCX_CUDA_IPC_ENABLE_GET_ZCOPY"
PROTO_INFO_ENV = "UCX_PROTO_INFO"
# cuda_ipc's cache of peers' mapped memory. On (UCX's default) a READ initiator keeps a SIGKILLed peer's GPU memory
# mapped until the initiator itself exits, removed remote agent or not; off, removing the agent gives it back
# (H200, benchmarks/nixl_dead_peer.py). A decode READs from prefill, so a decode with the cache on keeps a dead
# prefill's whole KV cache and its restart finds the GPU full (benchmarks/HISTORY.md, "Role deaths under load
# (chaos), H200").
IPC_CACHE_ENV = "UCX_CUDA_IPC_CACHE"


def cuda_ipc_env(*, with_report: bool = True, is_reader: bool = False) -> dict[str, str]:
    """UCX variables for same-host GPU-to-GPU NIXL READs over cuda_ipc (and the report that shows it). A reader
    (decode) also runs without cuda_ipc's mapping cache, so that a dead peer's memory can be given back."""
    env = {GET_ZCOPY_ENV: "y"}
    if is_reader:
        env[IPC_CACHE_ENV] = "n"
    if with_report:
        env[PROTO_INFO_ENV] = "y"
    return env


def merged_env(base: Mapping[str, str], wanted: Mapping[str, str]) -> dict[str, str]:
    """`wanted` under `base`: a variable the operator already set keeps the operator's value."""
    return {key: base.get(key, value) for key, value in wanted.items()}


class Transport(enum.Enum):
    CUDA_IPC = "cuda_ipc"
    CUDA_COPY = "cuda_copy"
    CMA = "cma"  # same-host DRAM (process_vm_readv)
    SHM = "shm"  # posix / sysv shared memory
    TCP = "tcp"
    OTHER = "other"


@dataclass(frozen=True, kw_only=True)
class ProtoSelection:
    """One protocol table of UCX's report: the operation, the memory it touches, and the transports of its rows."""

    operation: str  # "read" | "write" | "other" (active messages, tags, ...)
    memories: tuple[str, ...]  # memory kinds the header names, e.g. ("cuda", "cuda") or ("host", "cuda")
    transports: tuple[str, ...]  # tl names in row order, e.g. ("cuda_ipc",), ("tcp",)
    header: str

    @property
    def is_rma(self) -> bool:
        return self.operation in ("read", "write")

    @property
    def memory(self) -> str:
        """"cuda" when every side is GPU memory, "host" when every side is host memory, else "mixed"."""
        kinds = set(self.memories)
        return kinds.pop() if len(kinds) == 1 else "mixed" if kinds else "unknown"

    @property
    def transport(self) -> Transport:
        return classify(self.transports)


# A table (UCX 1.23, as printed on the H200; each line behind UCX's "[time] [host:pid:thread]" prefix):
#   | decode0-1017-c2771f intra-node cfg#2                                   |
#   | remote memory read by ucp_get*(multi) into cuda/GPU0 from cuda/dev[1] |
#   | Range  | Description | Config        |
#   | 0..inf | zero-copy   | cuda_ipc/cuda |
_OPERATIONS = ("remote memory", "active message", "tagged message", "stream", "remote atomic")
_TL = re.compile(r"\b(?P<tl>[a-z][a-z0-9_]*)/(?P<dev>[A-Za-z0-9_:.\-\[\]]+)")
_MEMORY = re.compile(r"\b(?:into|from|to)\s+(?P<mem>[a-z_]+)")


def parse_proto_info(text: str) -> list[ProtoSelection]:
    """The protocol tables of a UCX log (other lines ignored), in the order they were printed."""
    found: list[ProtoSelection] = []
    header: str | None = None
    tls: list[str] = []
    for line in text.splitlines():
        if "|" not in line:
            continue
        cells = [c.strip() for c in line[line.index("|"):].strip().strip("|").split("|")]
        opening = next((c for c in cells if c.startswith(_OPERATIONS)), None)
        if opening is not None:
            if header is not None:
                found.append(_selection(header, tls))
            header, tls = opening, []
            cells = cells[cells.index(opening) + 1:]  # an older one-line layout puts the rows beside it
        if header is None or len(cells) < 2 or cells[0] == "Range":
            continue
        for tl in _TL.finditer(cells[-1]):
            if tl.group("tl") not in tls:
                tls.append(tl.group("tl"))
    if header is not None:
        found.append(_selection(header, tls))
    return found


def _selection(header: str, tls: list[str]) -> ProtoSelection:
    lowered = header.lower()
    operation = "read" if "memory read" in lowered else "write" if "memory write" in lowered else "other"
    return ProtoSelection(operation=operation, memories=tuple(_MEMORY.findall(lowered)), transports=tuple(tls),
                          header=header)


def classify(tls: Iterable[str]) -> Transport:
    """The transport that carries the data: cuda_ipc beats a copy engine, which beats TCP."""
    names = set(tls)
    for transport, members in ((Transport.CUDA_IPC, {"cuda_ipc"}), (Transport.CMA, {"cma", "knem", "xpmem"}),
                               (Transport.SHM, {"posix", "sysv"}), (Transport.CUDA_COPY, {"cuda_copy"}),
                               (Transport.TCP, {"tcp"})):
        if names & members:
            return transport
    return Transport.OTHER


def rma_transport(selections: Iterable[ProtoSelection], *, memory: str | None = None,
                  operation: str | None = None) -> Transport | None:
    """The transport of the RMA tables (of one memory kind and operation, if given); TCP wins if any fell back.

    None when the report holds no such table (UCX_PROTO_INFO was off, or no transfer has run yet).
    """
    seen = [s.transport for s in selections if s.is_rma and (memory is None or s.memory == memory)
            and (operation is None or s.operation == operation)]
    if not seen:
        return None
    return Transport.TCP if Transport.TCP in seen else seen[-1]


def fallback_message(where: str, selections: Iterable[ProtoSelection]) -> str | None:
    """One line naming a TCP fallback of a GPU-to-GPU RMA, or None when there is none.

    Only tables whose every side is GPU memory count: UCX also prints a host-to-GPU write that it emulates over
    TCP on a healthy cuda_ipc setup (seen on the H200), which no NIXL transfer of GPU regions uses.
    """
    bad = [s for s in selections if s.is_rma and s.memory == "cuda" and s.transport is Transport.TCP]
    if not bad:
        return None
    return (f"{where}: UCX moves GPU memory over TCP ({bad[0].header}: {'/'.join(bad[0].transports)}), "
            f"not cuda_ipc; set {GET_ZCOPY_ENV}=y in the servers' environment")
