"""Fault injection for `hybridserve validate`'s own tests: reproduce the two async-scheduling P/D race classes.

Off unless `HYBRIDSERVE_FAULT` (one fault for the server's life: validate's `--fault` sets it) or
`HYBRIDSERVE_FAULT_FILE` (a file naming the fault armed now, empty for none, read at every worker step) is set in a
decode server's environment. With the file, every patch is in place and each acts only while the file names
its fault, so one running P/D deployment serves a clean run and then each fault, without a restart. Each kind
patches vLLM's NixlConnector pull worker (`nixl/pull_worker.py`, the decode side) in the running server:

- `early_completion` (race class a): a request's NIXL READ is reported finished before its bytes are in place.
  The READ is prepared but only posted `LATE_STEPS` worker steps later, so decode starts from whatever the
  freshly allocated blocks held, and the late bytes land under a running step.
- `zero_after_transfer` (race class b, vLLM PR #48481): the zeroing of newly allocated attention blocks runs
  after the remote write has landed, wiping the received attention KV (GDN state blocks are left alone).
- `stale_state` (race class b, vLLM PR #45357): blocks freed by a finished request are reused while a step is in
  flight, so the newly received GDN state is overwritten by a stale state (the previous request's).
- `slow_decode` (a latency fault, not a race: `bench`'s test): every engine step of the decode worker sleeps
  SLOW_DECODE_STEP_S. It sleeps in the per-step result poll (`get_transfer_results`, 0.26's `get_finished`), which
  vLLM's model runner calls once per step, with or without transfers (kv_connector_model_runner_mixin); a step
  makes one token per running request, so each inter-token gap is at least the sleep. Answers stay the same.
"""

from __future__ import annotations

import enum
import os
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from hybridserve.core.common.errors import InputError
from hybridserve.core.common.fault_kind import (
    FAULT_ENV, FAULT_FILE_ENV, SLOW_DECODE_STEP_S, FaultKind, parse_fault,
)
from hybridserve.core.vllm_plugin.import_hooks import after_import
from hybridserve.core.vllm_plugin.log import logger
from hybridserve.core.vllm_plugin.nixl_results import failed_recving, finished_recving, results_method

NIXL_PULL_WORKER_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_worker"
LATE_STEPS = 6  # worker steps; the first decode steps of the request run before the bytes land
_SHARED_REGION = -1  # vLLM's _SHARED_REGION_GROUP_ID: one tensor region used by layers of several groups

Armed = Callable[[], "FaultKind | None"]  # the fault acting now


def armed_from_file(path: Path) -> Armed:
    """The fault the file names now (missing, empty or unknown: none); each change is logged once."""
    last: list[FaultKind | None] = [None]

    def armed() -> FaultKind | None:
        try:
            kind = parse_fault(path.read_text())
        except (OSError, InputError):
            kind = None
        if kind is not last[0]:
            logger.warning("hybridserve FAULT switch: %s (was %s; %s)", kind.value if kind else "off",
                           last[0].value if last[0] else "off", path)
            last[0] = kind
        return kind

    return armed


class _DeferringNixl:
    """Stands in for the worker's nixl_wrapper during one `_read_blocks`: `transfer` is recorded, not posted."""

    def __init__(self, inner: Any) -> None:
        self._inner, self.deferred = inner, []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def transfer(self, handle: Any, *args: Any, **kwargs: Any) -> str:
        self.deferred.append(handle)
        return "PROC"


def _region_pages(worker: Any, region: int) -> Any:
    """vLLM 0.32: a registered region's memory as [num_blocks, page bytes] (the view vLLM's `_zero_region_blocks`
    builds)."""
    import torch

    base = worker.kv_caches_base_addr[worker.engine_id][worker.tp_rank][region]
    cache = worker.device_kv_caches[worker.region_names[region]]
    storage = cache.untyped_storage()
    return torch.empty(0, dtype=torch.uint8, device=cache.device).set_(
        storage, base - storage.data_ptr(),
        (worker.region_num_blocks[region], worker.block_len_per_layer[region]),
        (worker.block_stride_per_layer[region], 1))


def _tensor_pages(worker: Any, tensor: Any) -> Any:
    """vLLM 0.26: one KV cache tensor (`KVCacheTensor`: `size` bytes, `shared_by` layers) as [num_blocks, page
    bytes]. The model runner allocates each as its own int8 buffer, and with the hybrid allocator byte range
    [b * page, (b + 1) * page) holds logical block b of whichever group owns b (DESIGN.md, Memory layout)."""
    import torch

    cache = worker.device_kv_caches[tensor.shared_by[0]]
    cache = cache[0] if isinstance(cache, (list, tuple)) else cache  # GDN layers: (conv, ssm) views of the buffer
    storage, num_blocks = cache.untyped_storage(), worker.kv_cache_config.num_blocks
    if storage.nbytes() != tensor.size or tensor.size % num_blocks:
        raise ValueError(f"KV cache tensor of {tensor.shared_by[0]}: {storage.nbytes()} bytes allocated, "
                         f"{tensor.size} declared for {num_blocks} blocks")
    return torch.empty(0, dtype=torch.uint8, device=cache.device).set_(
        storage, 0, (num_blocks, tensor.size // num_blocks), (tensor.size // num_blocks, 1))


def _group_pages(worker: Any, group: int) -> list[Any]:
    """The page views that hold `group`'s blocks, indexed by the block ids `_block_ids` gives for the group."""
    if hasattr(worker, "region_group_ids"):  # 0.32
        return [_region_pages(worker, region) for region, owner in enumerate(worker.region_group_ids)
                if owner in (group, _SHARED_REGION)]
    layers = set(worker.kv_cache_config.kv_cache_groups[group].layer_names)  # 0.26
    return [_tensor_pages(worker, t) for t in worker.kv_cache_config.kv_cache_tensors if layers & set(t.shared_by)]


def _block_ids(worker: Any, meta: Any) -> Any:
    """Per group, the request's blocks as the page views count them: 0.32's regions are in kernel blocks
    (`local_physical_block_ids`), 0.26's tensors in logical blocks (`local_block_ids`; a GDN group's are the same)."""
    return meta.local_physical_block_ids if hasattr(worker, "region_group_ids") else meta.local_block_ids


def _is_gdn_group(worker: Any, group: int) -> bool:
    return "Mamba" in type(worker.kv_cache_config.kv_cache_groups[group].kv_cache_spec).__name__


def _overwrite(worker: Any, meta: Any, want_gdn: bool, source: dict[int, list[int]] | None) -> int:
    """Zero (source None) or overwrite from `source` the request's blocks of the chosen group kind."""
    num = 0
    for group, blocks in enumerate(_block_ids(worker, meta)):
        if not blocks or _is_gdn_group(worker, group) != want_gdn:
            continue
        src = (source or {}).get(group)
        for pages in _group_pages(worker, group):
            for i, block in enumerate(blocks):
                if src:
                    pages[block].copy_(pages[src[i % len(src)]])
                else:
                    pages[block].zero_()
                num += 1
    return num


def _patch_early_completion(worker_cls: Any, armed: Armed) -> None:
    name = results_method(worker_cls)
    read, results = worker_cls._read_blocks, getattr(worker_cls, name)

    def _read_blocks(self: Any, *args: Any, **kwargs: Any) -> Any:
        if armed() is not FaultKind.EARLY_COMPLETION:
            return read(self, *args, **kwargs)
        request_id = kwargs.get("request_id", args[2] if len(args) > 2 else None)
        real, deferring = self.nixl_wrapper, _DeferringNixl(self.nixl_wrapper)
        self.nixl_wrapper = deferring
        try:
            posted = read(self, *args, **kwargs)
        finally:
            self.nixl_wrapper = real
        handles = self._recving_transfers.get(request_id, [])
        late = self.__dict__.setdefault("_hybridserve_late", [])
        step = self.__dict__.get("_hybridserve_step", 0)
        for handle in deferring.deferred:
            if handle in handles:
                handles.remove(handle)  # nothing outstanding: the next poll reports the request finished
            late.append([handle, step + LATE_STEPS, False])
        if deferring.deferred:
            logger.warning("hybridserve FAULT early_completion: %s reported done, READ posted %d steps late",
                           request_id, LATE_STEPS)
        return posted

    def step_results(self: Any) -> Any:
        step = self.__dict__["_hybridserve_step"] = self.__dict__.get("_hybridserve_step", 0) + 1
        late = self.__dict__.setdefault("_hybridserve_late", [])
        for entry in list(late):
            handle, due, is_posted = entry
            if not is_posted and step >= due:
                self.nixl_wrapper.transfer(handle)
                entry[2] = True
            elif is_posted and self.nixl_wrapper.check_xfer_state(handle) != "PROC":
                self.nixl_wrapper.release_xfer_handle(handle)
                late.remove(entry)
        return results(self)

    worker_cls._read_blocks = _read_blocks
    setattr(worker_cls, name, step_results)


def _inject(worker: Any, kind: FaultKind, meta: Any) -> int:
    if kind is FaultKind.ZERO_AFTER_TRANSFER:
        return _overwrite(worker, meta, want_gdn=False, source=None)
    # stale_state: the first request has no predecessor; it only becomes the stale source of the next one
    previous = worker.__dict__.get("_hybridserve_previous")
    num = _overwrite(worker, meta, want_gdn=True, source=previous) if previous else 0
    worker.__dict__["_hybridserve_previous"] = {g: list(b) for g, b in enumerate(_block_ids(worker, meta)) if b}
    return num


def _patch_after_transfer(worker_cls: Any, kind: FaultKind, armed: Armed) -> None:
    name = results_method(worker_cls)
    results = getattr(worker_cls, name)

    def step_results(self: Any) -> Any:
        if armed() is not kind:
            return results(self)
        metas = dict(self._recving_metadata)
        out = results(self)
        failed = failed_recving(out)
        for req_id in finished_recving(out):
            meta = metas.get(req_id)
            if meta is None or req_id in failed:
                continue
            try:
                num = _inject(self, kind, meta)
            except Exception as e:  # noqa: BLE001 (a fault that cannot act must not end the engine mid-request)
                logger.warning("hybridserve FAULT %s: request %s left alone: %s", kind.value, req_id, e)
                continue
            logger.warning("hybridserve FAULT %s: request %s, %d page(s) overwritten after the transfer",
                           kind.value, req_id, num)
        return out

    setattr(worker_cls, name, step_results)


def _patch_slow_decode(worker_cls: Any, armed: Armed) -> None:
    name = results_method(worker_cls)
    results = getattr(worker_cls, name)

    def step_results(self: Any, *args: Any, **kwargs: Any) -> Any:
        if armed() is FaultKind.SLOW_DECODE:
            time.sleep(SLOW_DECODE_STEP_S)  # on the step's thread: the whole engine step waits
        return results(self, *args, **kwargs)

    setattr(worker_cls, name, step_results)


def patch_worker_module(module: ModuleType, kind: FaultKind | None, armed: Armed | None = None) -> None:
    """Arm `kind` for good; or, with `armed` (kind None), every kind, each acting while `armed()` names it."""
    worker_cls = module.NixlPullConnectorWorker
    if getattr(worker_cls, "_hybridserve_fault", None) is not None:
        return
    kinds = list(FaultKind) if kind is None else [kind]
    armed = armed or (lambda: kind)
    for each in kinds:  # the early-completion wrapper posts late READs on every step, armed or not: it goes first
        if each is FaultKind.EARLY_COMPLETION:
            _patch_early_completion(worker_cls, armed)
        elif each is FaultKind.SLOW_DECODE:
            _patch_slow_decode(worker_cls, armed)
        else:
            _patch_after_transfer(worker_cls, each, armed)
    worker_cls._hybridserve_fault = kind.value if kind else "switch"
    logger.warning("hybridserve FAULT armed: %s (NixlPullConnectorWorker patched)",
                   kind.value if kind else f"as {FAULT_FILE_ENV} names it")


def install_from_env() -> None:
    """Arm the fault named in HYBRIDSERVE_FAULT, else the switch HYBRIDSERVE_FAULT_FILE (nothing when both are
    unset). An unknown name in HYBRIDSERVE_FAULT is ignored with a warning."""
    path = os.environ.get(FAULT_FILE_ENV, "").strip()
    text = os.environ.get(FAULT_ENV, "").strip()
    if not text:
        if path:
            armed = armed_from_file(Path(path))
            after_import(NIXL_PULL_WORKER_MODULE, lambda module: patch_worker_module(module, None, armed))
        return
    try:
        kind = parse_fault(text)
    except InputError:
        logger.warning("hybridserve: %s=%r is not a fault kind; nothing armed", FAULT_ENV, text)
        return
    after_import(NIXL_PULL_WORKER_MODULE, lambda module: patch_worker_module(module, kind))
