"""What passes between the project's processes: environment variables, log lines, timeline events, headers and the
files of a run folder. Plain constants; this module imports nothing of the project.

The processes: launch (the supervisor), the vLLM plugin inside each engine's processes, the proxy, and the readers
of what they write (chaos, validate, bench, the tests). A writer and its readers both take the name from here, so
neither imports the other: the proxy never loads the plugin, chaos never reaches into the plugin's patch modules.
"""

from __future__ import annotations

# --- environment: launch -> the plugin in every vLLM process of a role (vllm_plugin/settings.py parses them) ---
NIXL_PROGRESS_DELAY_US = "HYBRIDSERVE_NIXL_PROGRESS_DELAY_US"
CPU_CORES = "HYBRIDSERVE_CPU_CORES"
KEEP_ASYNC_SCHEDULING = "HYBRIDSERVE_KEEP_ASYNC_SCHEDULING"
GDN_DISPATCH_PROFILE = "HYBRIDSERVE_GDN_DISPATCH_PROFILE"  # a tuned profile: route each GDN prefill batch by it
GDN_DISPATCH_LOG_CALLS = "HYBRIDSERVE_GDN_DISPATCH_LOG_CALLS"  # "1": also one log line per routed call (tests)
RELEASE_DEAD_PEERS = "HYBRIDSERVE_RELEASE_DEAD_PEERS"  # "1" on decode: a dead prefill's NIXL state is given back
PIN_PEER_REGIONS = "HYBRIDSERVE_PIN_PEER_REGIONS"  # "1" on a CUDA decode: live prefills' KV allocations held open
LEASE_GUARD = "HYBRIDSERVE_LEASE_GUARD"  # "1": prefill stamps its KV lease, decode reads only inside it
PLUGIN_DISABLE = "HYBRIDSERVE_PLUGIN_DISABLE"  # "1": the plugin does nothing at all (for A/B measurements)
LEASE_MARGIN_ENV = "HYBRIDSERVE_LEASE_MARGIN_S"  # the lease guard's safety margin (core/common/kv_lease.py)

# --- environment: validate, bench and the tests -> the plugin's faults in a decode server ---
FAULT_ENV = "HYBRIDSERVE_FAULT"  # one fault for the server's life
FAULT_FILE_ENV = "HYBRIDSERVE_FAULT_FILE"  # a file naming the fault armed now, read at every step

# --- environment: every process of a deployment -> one timeline file (core/common/timeline_log.py) ---
TIMELINE_FILE_ENV = "HYBRIDSERVE_TIMELINE_FILE"

# --- environment: the engines' key (vLLM's API server checks it; the proxy sends it) ---
ENGINE_KEY_ENV = "VLLM_API_KEY"

# --- environment: Ray Serve's replicas bind their servers and NIXL side channel here (core/rayserve) ---
BIND_HOST_ENV = "HYBRIDSERVE_BIND_HOST"

# --- kv_transfer_params keys: prefill's plugin -> the proxy -> decode's plugin (core/common/kv_lease.py) ---
LEASE_STAMP_KEY = "hybridserve_lease_end"  # Unix seconds after which prefill may free the blocks (a lower bound)
LEASE_REFUSED_KEY = "hybridserve_lease"  # in a decode answer's kv_transfer_params: how the lease guard served it
LEASE_REFUSED = "refused"

# --- headers: the proxy -> both engines of a request (vLLM keeps it inside its own request ids) ---
REQUEST_ID_HEADER = "X-Request-Id"

# --- log lines the plugin writes in an engine's log, read by launch, validate, bench, chaos and the tests ---
SCHEDULER_LOG_PREFIX = "hybridserve: engine scheduler"  # which scheduler the engine runs (async or not)
RECEIVED_LOG_PREFIX = "hybridserve: NIXL received request"  # decode got a request's KV and GDN state
REFUSED_LOG_PREFIX = "hybridserve: lease guard refused the READ of request"
RECOMPUTED_LOG_PREFIX = "hybridserve: lease guard computes the prompt of request"
RELEASED_LOG_PREFIX = "hybridserve: released the NIXL state of dead remote engine"
PINNED_LOG_PREFIX = "hybridserve: pinned the KV regions of remote engine"
UNPINNED_LOG_PREFIX = "hybridserve: could not pin the KV regions of remote engine"
GDN_ROUTER_LOG_PREFIX = "hybridserve: GDN prefill"

# --- timeline events written by no single request (`req` empty) ---
RELEASED_EVENT = "peer_released"  # a decode gave back a dead engine's NIXL state

# --- files of a run folder: launch writes them, chaos, bench, a later launch and the proxy read them ---
PLAN_FILE = "plan.json"  # every role's command line and environment
RESTART_LOG = "restarts.jsonl"  # one JSON line per restart event (core/supervise/role_watch.py)
LAUNCHER_PID_FILE = "launcher.pid"  # the launch process that owns the run (a later launch checks it)
WARM_FILE = "warm.json"  # engine URL -> WARMING / WARM (core/common/warm_state.py), read by the proxy
WARMING = "warming"
WARM = "warm"
