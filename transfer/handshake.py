"""Side channel: a prefill rank publishes its NIXL metadata and layout; a decode rank fetches, checks, loads.

Like vLLM's NIXL side channel (a socket the prefill side answers on), but the answer also carries what vLLM's
compatibility hash leaves out: the SSM and conv dtypes, the conv layout, block and kernel block sizes and TP.
Every wait has its own deadline; NIXL's own metadata calls never raise, so the loops here do.
"""

from __future__ import annotations

import base64
import json
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from hybridserve.core.layout.rank_layout import RankLayout
from hybridserve.transfer.errors import IncompatiblePeerError, TransferError, TransferTimeout

CONV_LAYOUT = "DS"  # VLLM_SSM_CONV_STATE_LAYOUT=DS: vLLM's hybrid P/D asserts it


@dataclass(frozen=True, kw_only=True)
class Compat:
    """What both sides must agree on; `tp` is checked against what the decode side was told to expect."""

    model: str
    kv_dtype: str
    conv_dtype: str
    ssm_dtype: str
    conv_layout: str
    block_size: int
    kernel_block_size: int
    tp: int

    @classmethod
    def of(cls, layout: RankLayout) -> Compat:
        return cls(model=layout.request.model.name, kv_dtype=layout.dtypes.kv.value,
                   conv_dtype=layout.dtypes.conv.value, ssm_dtype=layout.dtypes.ssm.value, conv_layout=CONV_LAYOUT,
                   block_size=layout.block_size, kernel_block_size=layout.kernel_block_size, tp=layout.request.tp)


def check_compat(peer: str, theirs: dict[str, Any], expected: Compat) -> None:
    """Refuse the first differing field, naming both values."""
    for field, mine in asdict(expected).items():
        if theirs.get(field) != mine:
            raise IncompatiblePeerError(f"peer {peer!r} is incompatible: {field} is {theirs.get(field)!r} there, "
                                        f"{mine!r} expected here")


@dataclass(frozen=True, kw_only=True)
class PeerInfo:
    agent_name: str
    agent_metadata: bytes
    compat: dict[str, Any]
    regions: tuple[tuple[int, int, int], ...]  # (address, bytes, device) per shared tensor, in tensor order
    num_blocks: int
    mem: str

    def to_json(self) -> bytes:
        data = asdict(self) | {"agent_metadata": base64.b64encode(self.agent_metadata).decode()}
        return json.dumps(data).encode() + b"\n"

    @classmethod
    def from_json(cls, raw: bytes) -> PeerInfo:
        data = json.loads(raw)
        return cls(agent_name=data["agent_name"], agent_metadata=base64.b64decode(data["agent_metadata"]),
                   compat=data["compat"], regions=tuple(tuple(r) for r in data["regions"]),
                   num_blocks=data["num_blocks"], mem=data["mem"])


class SideChannel:
    """Answers every connection with the current PeerInfo (`provide` is called per request)."""

    def __init__(self, provide: Callable[[], PeerInfo], host: str = "127.0.0.1", port: int = 0) -> None:
        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                self.wfile.write(provide().to_json())

        self._server = socketserver.ThreadingTCPServer((host, port), Handler, bind_and_activate=False)
        self._server.daemon_threads = True
        self._server.allow_reuse_address = True
        self._server.server_bind()
        self._server.server_activate()
        self.host, self.port = self._server.server_address[:2]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> SideChannel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def fetch_info(host: str, port: int, *, timeout_s: float) -> PeerInfo:
    """Connect (retrying while the listener is not up yet) and read one PeerInfo, within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    last = "no attempt"
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=max(0.05, deadline - time.monotonic())) as sock:
                sock.settimeout(max(0.05, deadline - time.monotonic()))
                raw = sock.makefile("rb").readline()
            if raw:
                return PeerInfo.from_json(raw)
            last = "empty answer"
        except OSError as exc:
            last = f"{type(exc).__name__}: {exc}"
        time.sleep(0.05)
    raise TransferTimeout(peer=f"{host}:{port}", phase="connect", timeout_s=timeout_s, detail=last)


def remote_region_rows(info: PeerInfo) -> np.ndarray:
    return np.array([[a, n, d] for a, n, d in info.regions], dtype=np.uint64).reshape(-1, 3)


def connect_peer(agent: Any, host: str, port: int, *, expected: Compat, timeout_s: float) -> tuple[PeerInfo, int]:
    """Fetch, check and load a peer; wait (bounded) until its metadata covers every region it announced.

    Metadata taken before the peer registered its memory loads fine but lacks the regions; it is re-fetched
    until it has them or the deadline passes. Returns (info, release key of the loaded peer).
    """
    deadline = time.monotonic() + timeout_s
    info = fetch_info(host, port, timeout_s=timeout_s)
    check_compat(info.agent_name, info.compat, expected)
    while True:
        try:
            name, key = agent.add_peer(info.agent_metadata)
        except Exception as exc:
            raise TransferError(peer=info.agent_name, phase="metadata",
                                detail=f"loading its metadata failed: {type(exc).__name__}: {exc}") from None
        rows = agent.nixl.get_xfer_descs(remote_region_rows(info), info.mem) if info.regions else None
        if rows is not None and agent.nixl.check_remote_metadata(name, rows):
            return info, key
        agent.release(key)
        if time.monotonic() > deadline:
            raise TransferTimeout(peer=info.agent_name, phase="metadata", timeout_s=timeout_s,
                                  detail=f"its metadata does not cover the {len(info.regions)} regions it "
                                         "announced: not registered yet")
        time.sleep(0.05)
        try:
            info = fetch_info(host, port, timeout_s=max(0.1, deadline - time.monotonic()))
        except TransferTimeout as exc:  # the peer answered before: what ran out is the wait for its metadata
            raise TransferTimeout(peer=info.agent_name, phase="metadata", timeout_s=timeout_s,
                                  detail=f"its metadata never covered the {len(info.regions)} regions it "
                                         f"announced; the last re-fetch: {exc.detail}") from None
