"""UCX's protocol report from the rank processes: which transport each bench row's transfers used.

Each rank process sets the UCX variables before its NIXL agent starts and sends its stdout (where UCX prints
the report of `UCX_PROTO_INFO=y`) to a file of its own. UCX prints a protocol table once, when a protocol is
first selected, so a row's transport is read from everything the decode ranks printed up to that row.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from hybridserve.core.common import ucx


class UcxCapture:
    def __init__(self, *, memory: str, keep_at: Path | None = None) -> None:
        self.memory = memory  # "cuda" (VRAM) or "host" (DRAM): the memory type of the tables that count
        self.dir = Path(tempfile.mkdtemp(prefix="hybridserve-ucx-"))
        self.keep_at = keep_at
        wanted = ucx.cuda_ipc_env() if memory == "cuda" else {ucx.PROTO_INFO_ENV: "y"}
        wanted["UCX_LOG_LEVEL"] = "info"  # these files are ours alone: keep UCX's own transport lines too
        self.env = ucx.merged_env(os.environ, wanted)

    def options(self, role: str, rank: int) -> dict[str, Any]:
        """Extra options for a rank process (see rank._child): its environment and where its stdout goes."""
        return {"env": self.env, "stdout_path": str(self.dir / f"{role}{rank}.log")}

    def text(self, role: str = "decode") -> str:
        return "".join(p.read_text(errors="replace") for p in sorted(self.dir.glob(f"{role}*.log")))

    def transport(self) -> ucx.Transport | None:
        """The transport of the decode ranks' READs so far (None: no table printed yet)."""
        return ucx.rma_transport(ucx.parse_proto_info(self.text()), memory=self.memory, operation="read")

    def close(self) -> None:
        if self.keep_at is not None:
            self.keep_at.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.keep_at.with_name(self.keep_at.name + ".tmp")
            tmp.write_text("".join(f"===== {p.name}\n{p.read_text(errors='replace')}"
                                   for p in sorted(self.dir.glob("*.log"))))
            tmp.replace(self.keep_at)
        shutil.rmtree(self.dir, ignore_errors=True)
