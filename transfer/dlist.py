"""Descriptor lists for one READ: local and remote rows, strided where a run of slices is equally spaced.

A row is (address, length, device, stride, count): `count` pieces of `length` bytes, `stride` bytes apart (NIXL
1.5.1's Nx5 "compressed" list; stride == length is dense). NIXL expands a strided row into `count` elements
when it prepares the list: transfer requests index and move elements, so `num_elements` is what a transfer
carries, while `num_descriptors` counts rows (a strided row is one descriptor).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True, kw_only=True)
class ReadDescriptors:
    """Everything one decode rank READs from one prefill rank for one request."""

    remote_rank: int
    local: np.ndarray  # Nx5 uint64 rows
    remote: np.ndarray
    num_attention: int  # rows
    num_gdn: int
    # vLLM's way (NixlConnector `register_local_xfer_handler` / `add_remote_agent`): the whole registration-time
    # lists (Nx3, every block of every region) are what gets prepared, and a request posts the descriptor ids
    # `local_index` / `remote_index` into them (`_compute_desc_ids`); `local` / `remote` are then those rows.
    prepared: tuple[np.ndarray, np.ndarray] | None = None
    local_index: np.ndarray | None = None
    remote_index: np.ndarray | None = None

    @property
    def num_descriptors(self) -> int:
        return self.num_attention + self.num_gdn

    @property
    def num_elements(self) -> int:
        return int(self.local[:, 4].sum()) if len(self.local) else 0

    @property
    def num_bytes(self) -> int:
        return int((self.local[:, 1] * self.local[:, 4]).sum()) if len(self.local) else 0

    @property
    def is_strided(self) -> bool:
        return bool(len(self.local)) and bool((self.local[:, 4] > 1).any() or (self.remote[:, 4] > 1).any())

    def for_prep(self) -> tuple[np.ndarray, np.ndarray]:
        """The whole lists when prepared vLLM's way; else Nx3 when no row is strided (NIXL's plain list), else the
        Nx5 rows for both sides."""
        if self.prepared is not None:
            return self.prepared
        if self.is_strided:
            return self.local, self.remote
        return np.ascontiguousarray(self.local[:, :3]), np.ascontiguousarray(self.remote[:, :3])

    def indices(self) -> tuple[np.ndarray, np.ndarray]:
        """What make_prepped_xfer is given: the descriptor ids, or every element of a request's own lists."""
        if self.local_index is not None and self.remote_index is not None:
            return self.local_index, self.remote_index
        every = np.arange(self.num_elements, dtype=np.int32)
        return every, every

    def expanded(self) -> tuple[np.ndarray, np.ndarray]:
        """Every element as an Nx3 (address, length, device) row, for checks and in-process copies."""
        return _expand(self.local), _expand(self.remote)


def _expand(rows: np.ndarray) -> np.ndarray:
    counts = rows[:, 4].astype(np.int64)
    index = np.repeat(np.arange(len(rows)), counts)
    within = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    out = np.empty((len(index), 3), dtype=np.uint64)
    out[:, 0] = rows[index, 0] + rows[index, 3] * within.astype(np.uint64)
    out[:, 1] = rows[index, 1]
    out[:, 2] = rows[index, 2]
    return out


@dataclass
class RowBuilder:
    """Collects matching local/remote rows; a strided pair that is dense on both sides becomes one range."""

    local_device: int
    remote_device: int
    local: list[tuple[int, int, int, int, int]] = field(default_factory=list)
    remote: list[tuple[int, int, int, int, int]] = field(default_factory=list)
    num_attention: int = 0
    num_gdn: int = 0

    def add(self, *, local: int, remote: int, length: int, is_attention: bool, count: int = 1,
            local_stride: int | None = None, remote_stride: int | None = None) -> None:
        ls = length if local_stride is None else local_stride
        rs = length if remote_stride is None else remote_stride
        if count > 1 and ls == length and rs == length:
            length, count, ls, rs = length * count, 1, length * count, length * count
        self.local.append((local, length, self.local_device, ls, count))
        self.remote.append((remote, length, self.remote_device, rs, count))
        if is_attention:
            self.num_attention += 1
        else:
            self.num_gdn += 1

    def build(self, remote_rank: int) -> ReadDescriptors:
        def arr(rows: list[tuple[int, ...]]) -> np.ndarray:
            return np.array(rows, dtype=np.uint64).reshape(-1, 5)

        return ReadDescriptors(remote_rank=remote_rank, local=arr(self.local), remote=arr(self.remote),
                               num_attention=self.num_attention, num_gdn=self.num_gdn)
