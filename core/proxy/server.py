"""The proxy's uvicorn server: uvicorn's own, telling the relays when it begins to stop (stopping.py)."""

from __future__ import annotations

import socket

import uvicorn

from hybridserve.core.proxy.stopping import Stopping


class ProxyServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, stopping: Stopping) -> None:
        super().__init__(config)
        self.stopping = stopping

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """Before uvicorn waits for the open responses: each relayed stream ends with its error event instead of
        holding the proxy until a SIGKILL."""
        self.stopping.set()
        await super().shutdown(sockets)
