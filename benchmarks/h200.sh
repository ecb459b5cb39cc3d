#!/usr/bin/env bash
# The H200 measurements: one stage a device call (each under 600 s), results under $OUT; feeds BENCHMARKS.md,
# "H200 runs" (each stage names the section it feeds). From the repository root on the device machine:
#   bash benchmarks/h200.sh copy-bundle vllm .vb/part01     # ... .vb/part10: one call each, carry .vb/partNN
#   bash benchmarks/h200.sh copy-bundle nixl .gpu/nx        # carry .gpu/nx (nixl_only.tgz)
#   bash benchmarks/h200.sh copy-bundle flashqla .gpuwork/fq1   # carry it: fla.tgz and FlashQLA's wheels
#   bash benchmarks/h200.sh copy-bundle ray .rb/part01      # ... each part of scripts/ray_h200_bundle.sh .rb
#   bash benchmarks/h200.sh prepare                   # vLLM's install and the 60-layer model, to chain after the
#                                                     # last copy call (serve and validate then start sooner)
#   bash benchmarks/h200.sh kernels [FLAGS]           # "GDN prefill kernels": verify + tune fla and FlashInfer in
#                                                     # vLLM's environment, then the routing's per-call cost
#   bash benchmarks/h200.sh kernels-flashqla [FLAGS]  # the same for FlashQLA, in its own environment
#   bash benchmarks/h200.sh tuned-serving [FLAGS]     # "The tuned profile served, H200": tuned, default, control
#   bash benchmarks/h200.sh transfer                  # "Transfer": transfer bench --memory vram, get_zcopy off,
#                                                     # READ against WRITE, then UCX settings and the staged path
#   bash benchmarks/h200.sh serve [FLAGS]             # "Served P/D": benchmarks/served_pd.py (60 layers), FLAGS
#                                                     # passed through
#   bash benchmarks/h200.sh validate [FLAGS]          # "Validate": P/D against one server, 60 layers, random
#                                                     # 1k, 8k and 32k prompts, first token from prefill (launch's
#                                                     # proxy) and from decode (a second proxy, vLLM's way);
#                                                     # FLAGS go to hybridserve validate
#   bash benchmarks/h200.sh fallback-warning          # "launch's TCP-fallback warning, live"
#   bash benchmarks/h200.sh served-start              # "Served on the H200, as users serve": benchmarks/served_h200.py
#   bash benchmarks/h200.sh served-bench              # start, then bench, faults, stop: one call each, back to back
#   bash benchmarks/h200.sh served-faults             # (the servers live across the calls; bench before faults, so
#   bash benchmarks/h200.sh served-stop               # that plan can follow the servers' request history)
#   bash benchmarks/h200.sh equal-resources [SET]     # "P/D against aggregated replicas at equal resources":
#                                                     # benchmarks/equal_resources.py call, MPS shares of GPU 0
#                                                     # (SET 1p1d: 1P1D against 2 replicas; 3: 2P1D and 1P2D
#                                                     # against 3 replicas); the step profile first, then the
#                                                     # sweep: call again until "sweep done"
#   bash benchmarks/h200.sh chaos [FLAGS]             # "Role deaths under load (chaos), H200":
#                                                     # benchmarks/chaos.py, 60 layers, one prefill and two decodes
#                                                     # on GPU 0, in the background: call again until "chaos done";
#                                                     # FLAGS passed through (--kills ...)
#   bash benchmarks/h200.sh lease-burst [FLAGS]       # "Prefill's KV lease": benchmarks/lease_burst.py, 60 layers
#                                                     # served as users serve (CUDA graphs, vLLM's GDN backend, async
#                                                     # scheduling), a 5 s lease, a burst of 64 queued 8 deep on
#                                                     # decode, every answer judged; FLAGS passed through
#   bash benchmarks/h200.sh dead-peer [FLAGS]         # "A dead engine's GPU memory, held by its NIXL peer (H200)":
#                                                     # benchmarks/nixl_dead_peer.py (nixl alone, no vLLM)
#   bash benchmarks/h200.sh ipc-cache-cost [FLAGS]    # the same section: a READ's time by the target's allocations,
#                                                     # cuda_ipc cache on, off, and off with the peer pin
#                                                     # (benchmarks/nixl_ipc_cache_cost.py)
#   bash benchmarks/h200.sh first-burst-kernel        # "The first burst after a start": FlashInfer's GDN prefill
#                                                     # paths' first calls in a fresh process (first_burst.py)
#   bash benchmarks/h200.sh first-burst ROLE WARMUP   # the same section: launch --role ROLE (single, all) with the
#                                                     # warm-up on or off, a first burst and the same again
#   bash benchmarks/h200.sh ray-check                 # Ray's bundle beside vLLM 0.26 before a served Ray run: the
#                                                     # imports, launch --engine ray's dry run, the app built from
#                                                     # it, the plugin's compat check (benchmarks/ray_h200_check.py);
#                                                     # no engine (vLLM parts 01-08 and the ray parts suffice)
#   bash benchmarks/h200.sh cold-start [FLAGS]        # launch with vLLM's defaults (issue 38, docs/served-defaults.md):
#                                                     # its dry run on this GPU, a cold start of the 60-layer model
#                                                     # (a fresh torch.compile cache) to healthy, and each engine's
#                                                     # start-up lines that launch's progress line reads; FLAGS go
#                                                     # to launch
# FLAGS go to the stage's script (kernels: benchmarks/kernels_h200.py tune; tuned-serving:
# benchmarks/served_tuned_profile.py); a later flag wins over the stage's own.
# HYBRIDSERVE_DRY=1 prints what a stage would run and runs nothing (tests/test_benchmarks_md.py runs every stage
# so on a CPU). DEADLINE (epoch s, default now + 560) bounds each step. The machine keeps /tmp while it stays
# warm, so the installs (benchmarks/gpu_env.sh), the models and Triton's cache carry over to the next stage.
set -o pipefail
cd "$(dirname "$0")/.." || exit 3
here=$(pwd)
stage=${1:-}
shift 2> /dev/null
DRY=${HYBRIDSERVE_DRY:-}
OUT=${OUT:?OUT: the folder for the results}
mkdir -p "$OUT"
deadline=${DEADLINE:-$(( $(date +%s) + 560 ))}
export DEADLINE=$deadline  # the stage's scripts end their own work before it (served_h200.py, served_pd.py)
M60=/tmp/m60                           # the 60-layer model (Qwen3.5-397B's TP1 per-layer geometry, random weights)
# served as users serve: CUDA graphs, vLLM's own GDN prefill choice, async scheduling; a context for the 32k prompts
M60_FLAGS=(--model $M60 --device cuda --max-model-len 34816)

say() { echo "[$(date -u +%T)] $*" | tee -a "$OUT/stage.log"; }
# seconds left before the deadline, less $1; at least 1 (timeout 0 would never stop)
left() { local s=$(( deadline - $(date +%s) - $1 )); echo $(( s > 1 ? s : 1 )); }

# setup PART...: the installs of benchmarks/gpu_env.sh (vllm, nixl, fla, flashqla), and `hybridserve` on PATH
setup() {
  if [ -n "$DRY" ]; then echo "setup: $*"; return 0; fi
  source benchmarks/gpu_env.sh "$here" || exit 3
  # one Triton cache for every stage (served_pd.py uses it too): a stage after validate starts its servers warm
  export TRITON_CACHE_DIR=/tmp/hs-triton
  local part
  for part in "$@"; do "install_$part" || { say "install $part failed"; exit 3; }; done
  mkdir -p /tmp/hsbin
  printf '#!/bin/sh\nexec python3 -c "from hybridserve.cli.app import main; main()" "$@"\n' > /tmp/hsbin/hybridserve
  chmod +x /tmp/hsbin/hybridserve
  export PATH=/tmp/hsbin:$PATH
  { date -u; nvidia-smi -L; python3 -c "import importlib.metadata as m, sys
for d in sys.argv[1:]:
    try: print(d, m.version(d))
    except m.PackageNotFoundError: pass" vllm flashinfer-python fla-core flash-qla tilelang apache-tvm-ffi torch triton \
      nvidia-cutlass-dsl nixl; } >> "$OUT/env.txt" 2>&1
}

# run LOG SECONDS CMD...: CMD under `timeout SECONDS`, stdout to LOG, stderr to LOG.err
run() {
  local log=$1 seconds=$2; shift 2
  if [ -n "$DRY" ]; then echo "run: $(printf '%q ' "$@")> $log"; return 0; fi
  timeout "$seconds" "$@" > "$log" 2> "$log.err"
  local rc=$?; say "$(basename "$log"): rc=$rc"; return $rc
}

# start LOG CMD...: CMD in the background (its pid in $started); stop PID: SIGINT, then wait (launch stops its roles)
start() {
  local log=$1; shift
  if [ -n "$DRY" ]; then echo "start: $(printf '%q ' "$@")> $log"; started=0; return 0; fi
  "$@" > "$log" 2>&1 &
  started=$!
}
stop() { [ -n "$DRY" ] || { kill -INT "$1" 2> /dev/null; wait "$1"; }; }

# pack: every result under $OUT into one archive, $OUT/results.tgz (the device returns at most 8 files a call: the
# serve run of 2026-12-02 lost its validate JSON and timeline that way)
pack() {
  [ -n "$DRY" ] && { echo "pack: $OUT/results.tgz"; return 0; }
  tar czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/results.tgz"
}

# healthy URL SECONDS [PID]: wait for URL/health; with PID (the launch behind it) stop waiting once it has exited
# (2026-12-05: a launch that refused at once, nixl missing, held the call 227 s of a 7-minute budget)
healthy() {
  if [ -n "$DRY" ]; then echo "wait: $1/health"; return 0; fi
  local t0; t0=$(date +%s)
  while [ $(( $(date +%s) - t0 )) -lt "$2" ]; do
    curl -sf "$1/health" > /dev/null && { say "$1 healthy after $(( $(date +%s) - t0 )) s"; return 0; }
    if [ -n "${3:-}" ] && ! kill -0 "$3" 2> /dev/null; then
      say "$1 not healthy: its launch (pid $3) exited after $(( $(date +%s) - t0 )) s"; return 1
    fi
    sleep 2
  done
  say "$1 not healthy after $2 s"; return 1
}

# a stage that serves P/D needs nixl beside vLLM, which install_vllm adds only when its bundle was copied: say so at once
need_nixl() {
  [ -n "$DRY" ] || [ -f /tmp/nixlsite/.hs_ok ] || { say "no nixl here: copy-bundle nixl .gpu/nx first (P/D needs it)"; exit 3; }
}

# the 60-layer model, once a machine
model_60_layers() {
  [ -z "$DRY" ] && [ -f $M60/config.json ] && return 0
  run "$OUT/model.txt" 120 python3 scripts/make_gdn_bench_model.py $M60 --tp 1 --layers 60 --hidden 1024
}

# the last lines of each server log of a run folder, into $OUT/logs
keep_logs() {
  [ -n "$DRY" ] && return 0
  mkdir -p "$OUT/logs"
  local f
  for f in "$1"/*/*.log; do
    [ -f "$f" ] && grep -v "GET /health" "$f" | tail -c 40000 > "$OUT/logs/$(basename "$(dirname "$f")")_$(basename "$f")"
  done
}

copy_bundle() {  # KIND FOLDER: a carried folder into the stash gpu_env.sh reads
  local to
  case "$1" in
    vllm) to=/tmp/vbstash ;;
    nixl) to=/tmp/nxstash ;;
    flashqla) to=/tmp/fqstash ;;
    ray) to=/tmp/rbstash ;;
    *) echo "copy-bundle: KIND vllm, nixl, flashqla or ray, then the carried folder"; exit 2 ;;
  esac
  [ -d "$2" ] || { echo "copy-bundle: $2 is not a folder here (carry it)"; exit 2; }
  if [ -n "$DRY" ]; then echo "copy: $2 -> $to"; return 0; fi
  mkdir -p "$to" && cp -r "$2"/* "$to"/ && say "copied $2 into $to: $(ls "$to" | wc -l) files"
}

kernels() {  # fla + FlashInfer (vLLM 0.26's): verify, then tune over 4 TPs x 5 shapes; then the routing's cost
  setup vllm fla
  run "$OUT/kernels.out" "$(left 90)" python3 benchmarks/kernels_h200.py tune --out "$OUT/kernels" \
    --backends fla flashinfer --verify-backends torch fla flashinfer --budget-s "$(left 150)" "$@"
  [ -n "$DRY" ] || tail -30 "$OUT/kernels.out"
  run "$OUT/route_cost.out" "$(left 10)" python3 benchmarks/kernels_h200.py route-cost \
    --profile profiles/tuned/h200.yaml --out "$OUT/route_cost.json"
}

kernels_flashqla() {  # FlashQLA in its own environment: verify (the cases that broke it) + tune
  setup flashqla
  local cases=(len1 len65 len1000 zero-len-inside varlen init-state gva4
               qwen3.5-397b-a17b-tp1 qwen3.5-397b-a17b-tp2 qwen3.5-397b-a17b-tp4 qwen3.5-397b-a17b-tp8)
  run "$OUT/kernels_flashqla.out" "$(left 10)" python3 benchmarks/kernels_h200.py tune \
    --out "$OUT/kernels_flashqla" --backends flashqla --verify-backends torch flashqla \
    --verify-cases "${cases[@]}" --budget-s "$(left 40)" "$@"
  [ -n "$DRY" ] || tail -30 "$OUT/kernels_flashqla.out"
}

tuned_serving() {  # the shipped profile against vLLM's default and a control copy of it, all three at once
  setup vllm
  run "$OUT/model.txt" 120 python3 scripts/make_gdn_bench_model.py /tmp/gdn-tp2 --tp 2
  run "$OUT/served_tuned_profile.out" "$(left 20)" python3 benchmarks/served_tuned_profile.py --model /tmp/gdn-tp2 \
    --profile profiles/tuned/h200.yaml --device cuda --tp 1 --ttft-prompts 30 --greedy-tokens 16 \
    --control --gpu-share 0.28 --run-dir /tmp/hs-ts \
    --out "$OUT/served_tuned_profile.json" "$@"
  keep_logs /tmp/hs-ts
}

transfer() {  # 397B TP1->1, bf16 SSM: both schemes at 1k/8k/32k; READ over TCP marked; READ against WRITE
  if [ -n "$DRY" ] || [ -f /tmp/vbstash/install.sh ]; then setup vllm; else setup nixl; fi
  local bench=(hybridserve transfer bench -m qwen3.5-397b-a17b --mamba-ssm-cache-dtype bfloat16 --memory vram --json)
  run "$OUT/transfer_vram.json" 240 "${bench[@]}" --ucx-log "$OUT/ucx_bench.log"
  run "$OUT/transfer_vram_get_zcopy_off.json" 120 env UCX_CUDA_IPC_ENABLE_GET_ZCOPY=n "${bench[@]}" \
    --prompt-len 32768 --requests 1 --ucx-log "$OUT/ucx_bench_get_zcopy_off.log"
  run "$OUT/read_vs_write.json" 150 python3 benchmarks/nixl_read_vs_write.py
  if [ -n "$DRY" ] || [ "$(left 20)" -gt 120 ]; then
    run "$OUT/ucx_settings.out" "$(left 10)" python3 benchmarks/transfer_ucx_settings.py --out "$OUT/ucx_settings" \
      --budget "$(left 30)"
  else
    say "no time left for the UCX settings and the staged path"
  fi
}

prepare() {  # the installs and the 60-layer model, ahead of serve or validate (each a call near 600 s)
  setup vllm
  model_60_layers
}

serve() {  # the 60-layer model: P/D against one server, idle 1k/8k/32k and under load
  setup vllm; need_nixl
  model_60_layers
  run "$OUT/served_pd.out" "$(left 10)" python3 benchmarks/served_pd.py "$@"
  [ -n "$DRY" ] || tail -40 "$OUT/served_pd.out"
  pack
}

validate() {  # the 60-layer model: P/D (0.3 of the GPU each role) judged against one server (0.3) by URL
  setup vllm; need_nixl
  model_60_layers
  start "$OUT/launch_pd.out" hybridserve launch --role all "${M60_FLAGS[@]}" --gpu-memory-utilization 0.6 \
    --base-port 8000 --run-dir /tmp/hs-val --timeout "$(left 200)"
  local pd=$started
  # one start after the other: vLLM sizes its KV cache from the memory free while it profiles
  healthy http://127.0.0.1:8000 "$(left 200)" $pd || { stop $pd; keep_logs /tmp/hs-val; exit 1; }
  start "$OUT/launch_single.out" hybridserve launch --role single "${M60_FLAGS[@]}" --gpu-memory-utilization 0.3 \
    --base-port 9000 --run-dir /tmp/hs-val --timeout "$(left 120)"
  local single=$started
  # a second proxy on the same P/D takes the first token from decode (vLLM's way): both ways judged, one run
  start "$OUT/proxy_decode_first.out" python3 -m hybridserve.core.proxy --port 8001 --first-token decode \
    --prefill http://127.0.0.1:8100 --decode http://127.0.0.1:8200
  local classic=$started
  if healthy http://127.0.0.1:9200 "$(left 120)" $single; then
    local way
    for way in prefill:8000 decode:8001; do
      run "$OUT/validate_60_layers_first_${way%:*}.json" "$(left 20)" hybridserve validate \
        --baseline http://127.0.0.1:9200 --candidate "http://127.0.0.1:${way#*:}" --reference http://127.0.0.1:9200 \
        --model $M60 --dataset random --prompt-len 1024 --prompt-len 8192 --prompt-len 32768 --max-tokens 16 --timeout "$(left 25)" \
        --json "$@"
      [ -n "$DRY" ] || tail -5 "$OUT/validate_60_layers_first_${way%:*}.json.err"
    done
  fi
  stop $classic; stop $single; stop $pd
  keep_logs /tmp/hs-val
  pack
}

fallback_warning() {  # launch's warning, live: a healthy start, then get_zcopy switched off in the topology
  setup vllm; need_nixl
  [ -n "$DRY" ] || cat > /tmp/fallback.yaml <<YAML
model: $here/profiles/tiny-qwen3.5-recall
device: cuda
engine: {enforce_eager: true, gdn_prefill_backend: triton}
prefill: [{port: 8100, side_channel_port: 8150, devices: [0], env: {UCX_CUDA_IPC_ENABLE_GET_ZCOPY: "n"}}]
decode: [{port: 8200, side_channel_port: 8250, devices: [0], env: {UCX_CUDA_IPC_ENABLE_GET_ZCOPY: "n"}}]
proxy: {port: 8000}
YAML
  local body='{"model":"tiny-qwen3.5-recall","prompt":"S01 a b S02 c d S01 e f","max_tokens":4,"temperature":0}'
  local name args pid
  for name in healthy fallback; do
    if [ $name = healthy ]; then
      args=(--model profiles/tiny-qwen3.5-recall --device cuda --enforce-eager --gdn-prefill-backend triton)
    else
      args=(--topology /tmp/fallback.yaml)
    fi
    start "$OUT/$name.out" hybridserve launch --role all --run-dir "/tmp/hs-$name" "${args[@]}"
    pid=$started
    if healthy http://127.0.0.1:8000 "$(left 30)" $pid && [ -z "$DRY" ]; then
      for _ in 1 2 3; do curl -s localhost:8000/v1/completions -H 'content-type: application/json' -d "$body"; echo; done \
        >> "$OUT/$name.out"
      sleep 8  # launch's transport watch looks every 5 s
    fi
    stop $pid
    [ -n "$DRY" ] || grep -h "warning" "$OUT/$name.out"
    keep_logs "/tmp/hs-$name"
  done
}

served_step() {  # STEP: the deployments started once, all at once, then bench, validate's faults, stop
  # (HS_SERVED_DEPLOYMENTS naming `ray`: Ray's bundle too, copied with `copy-bundle ray`)
  case ",${HS_SERVED_DEPLOYMENTS:-}," in *,ray,*) setup vllm ray ;; *) setup vllm ;; esac
  need_nixl
  [ "$1" = start ] && model_60_layers
  run "$OUT/served_$1.out" "$(left 5)" python3 benchmarks/served_h200.py "$1" --out "$OUT"
  [ -n "$DRY" ] || tail -c 4000 "$OUT/served_$1.out"
  if [ "$1" = stop ]; then
    keep_logs /tmp/hs-served/runs
  fi
  pack
}

chaos() {  # the 60-layer model, prefill and two decodes on GPU 0 (0.3 each): SIGKILL decode-0 then decode-1,
  # prefill, the proxy. Three cold 60-layer starts and four restarts outlast one call, so the bench runs in its own
  # session (it outlives the call) and each `chaos` call waits for it until the call's deadline: call the stage
  # again, back to back, until it prints "chaos done" (the results come with that call)
  setup vllm; need_nixl
  model_60_layers
  local state=/tmp/hs-chaos
  if [ -n "$DRY" ] || [ ! -f $state/pid ]; then
    [ -n "$DRY" ] || { rm -rf $state; mkdir -p $state; }
    # the GPU's memory every 2 s, whole and per process, for the run (a dead prefill's memory given back, or not)
    start $state/gpu_used.csv setsid nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader,nounits -l 2
    [ -n "$DRY" ] || echo $started > $state/smi.pid
    start $state/gpu_apps.csv setsid nvidia-smi --query-compute-apps=timestamp,pid,used_memory \
      --format=csv,noheader,nounits -l 2
    [ -n "$DRY" ] || echo $started >> $state/smi.pid
    start $state/chaos.out setsid -w python3 benchmarks/chaos.py --device cuda --model $M60 \
      --engine '{"max_model_len": 34816}' \
      --kills decode-0,decode-1@8 prefill-0 proxy --start-timeout 300 --out $state/chaos.json --keep-logs $state/logs "$@"
    [ -n "$DRY" ] && return 0
    echo $started > $state/pid
    say "chaos started (pid $started)"
  fi
  while kill -0 "$(cat $state/pid)" 2> /dev/null && [ "$(left 15)" -gt 1 ]; do sleep 5; done
  if kill -0 "$(cat $state/pid)" 2> /dev/null; then
    say "chaos still running: call the stage again"; tail -c 1500 $state/chaos.out; return 0
  fi
  say "chaos done"
  [ -f $state/smi.pid ] && kill $(cat $state/smi.pid) 2> /dev/null
  cp -r $state/. "$OUT"/
  tail -40 $state/chaos.out
  pack
}

lease_burst() {  # prefill and decode on GPU 0, a 5 s KV lease, decode 8 sequences at a time: 64 requests of 8k
  # tokens at once, 512 out, so the last ones wait in decode's queue well past the lease (2026-12-05, 128 out with
  # CUDA graphs: decode's queue at most 2.83 s, every READ within 3.14 s of prefill's answer: the lease never ran
  # out). Served as users serve: no
  # --enforce-eager (CUDA graphs), vLLM's own GDN prefill backend, async scheduling; --max-num-seqs 8 is the
  # probe's design (a queue that outlasts the lease), --max-model-len the prompts' need. One cold start (~280 s) and the
  # reference answers (prefill's own, 16 prompts twice, 8 at a time) before the burst. After served-start (its
  # pd-lease deployment, the same settings, still serving) it attaches to that one instead: no start of its own.
  setup vllm; need_nixl
  local state=${HS_SERVED_STATE:-/tmp/hs-served} attach=()
  if [ -z "$DRY" ] && grep -q '"endpoints"' "$state/launch-pd-lease.json" 2> /dev/null; then
    attach=(--attach "$state"); say "lease-burst: attached to served-start's pd-lease"
  else
    model_60_layers
  fi
  run "$OUT/lease_burst.out" "$(left 10)" python3 benchmarks/lease_burst.py --device cuda --model $M60 \
    --lease-s 5 --max-num-seqs 8 --max-model-len 16384 --requests 64 --num-prompts 16 --prompt-len 8192 \
    --max-tokens 512 --stall-probes 2 --start-timeout "$(left 200)" --timeout 200 --base-port 8000 \
    --out "$OUT/lease_burst.json" --keep-logs "$OUT/logs" "${attach[@]}" "$@"
  [ -n "$DRY" ] || tail -30 "$OUT/lease_burst.out"
  pack
}

ipc_cache_cost() {  # a READ's time with cuda_ipc's mapping cache on (UCX's default), off (launch's decode) and off
  # with the plugin's peer pin (a memory view held over each region): the target's memory in 15 allocations (vLLM
  # 0.26's KV cache tensors of the 60-layer model) and in 15 regions of one allocation, read by a later peer (a decoy
  # took the key UCX keeps open, as after a prefill's restart); the served descriptor counts (195 at 1k, 420 at 32k).
  # Then the cache off by allocations (1, 5, 15) for a first and a later peer: what one open costs
  setup nixl
  # (the budgets leave dead-peer 130 s when both share one DEADLINE in one device call)
  run "$OUT/ipc_cache_cost.json" "$(left 260)" python3 benchmarks/nixl_ipc_cache_cost.py --descriptors 195 420 \
    --layout separate carved --regions 15 --peer later --setting cache_on --setting cache_off --setting pinned "$@"
  run "$OUT/ipc_cache_cost_allocations.json" "$(left 130)" python3 benchmarks/nixl_ipc_cache_cost.py \
    --descriptors 195 --layout separate --regions 1 5 15 --peer first later --setting cache_off
  [ -n "$DRY" ] || cat "$OUT/ipc_cache_cost.json" "$OUT/ipc_cache_cost_allocations.json"
}

dead_peer() {  # a READ initiator's hold on a SIGKILLed target's VRAM: cuda_ipc's cache on and off, and off with the
  # peer pin's view released before the agent (the plugin's order) or not (the control)
  setup nixl
  run "$OUT/dead_peer.json" "$(left 10)" python3 benchmarks/nixl_dead_peer.py --setting default --setting cache_off \
    --setting pinned --setting pinned_unreleased "$@"
  [ -n "$DRY" ] || cat "$OUT/dead_peer.json"
}

equal_resources() {  # SET [FLAGS]: one call of the sweep; the MPS daemon never outlives it
  setup vllm; need_nixl
  model_60_layers
  local set=${1:-1p1d} had_mps=0
  shift 2> /dev/null
  if [ -z "$DRY" ] && pgrep -f nvidia-cuda-mps-control > /dev/null; then had_mps=1; fi
  run "$OUT/equal_resources.out" "$(left 5)" python3 benchmarks/equal_resources.py call --set "$set" --out "$OUT" "$@"
  [ -n "$DRY" ] || tail -c 4000 "$OUT/equal_resources.out"
  # the script quits the daemon it started; a script killed at the deadline cannot, so quit it here
  if [ -z "$DRY" ] && [ $had_mps = 0 ] && pgrep -f nvidia-cuda-mps-control > /dev/null; then
    echo quit | nvidia-cuda-mps-control; say "MPS daemon quit by h200.sh"
  fi
  keep_logs "/tmp/hs-equal/$set/runs"
  pack
}

# the vLLM log lines core/supervise/start_phase.py names a phase by (its MARKERS)
PHASE_LINES='Starting to load model|Loading weights took|Model loading took|Dynamo bytecode transform|Compiling a graph'\
'|Directly load the compiled|torch.compile took|Memory profiling takes|Profiling CUDA graph memory|Available KV cache'\
'|KV cache size|Compile and warming up|Warming up model|Capturing CUDA graphs|Graph capturing finished|init engine'\
'|Starting vLLM server|Application startup complete|with config:|GDN prefill kernel|Auto-fit max_model_len'\
'|Maximum concurrency|Mamba cache blocks|Error'

cold_start() {  # launch as users serve, cold: the dry run, the time to healthy, every engine's start-up lines;
  # HS_COLD_ROLE=prefill starts only P/D's prefill (its share of a P/D launch, no wait for it before decode's start)
  setup vllm; need_nixl
  model_60_layers
  local role=${HS_COLD_ROLE:-all} url=http://127.0.0.1:8000
  [ "$role" = prefill ] && url=http://127.0.0.1:8100
  run "$OUT/cold_dry_run.json" 60 hybridserve launch --role all --device cuda --model $M60 --dry-run --json "$@"
  start "$OUT/cold_launch.out" env VLLM_CACHE_ROOT=/tmp/hs-cold-cache-$$ hybridserve launch --role "$role" \
    --device cuda --model $M60 --run-dir /tmp/hs-cold --json "$@"
  local pid=$started
  healthy $url "$(left 30)" $pid || [ -n "$DRY" ] || tail -5 "$OUT/cold_launch.out"
  stop $pid
  [ -n "$DRY" ] && return 0
  local f
  for f in /tmp/hs-cold/*/*-0.log; do  # tqdm redraws its bar with CR: one line per redraw
    tr '\r' '\n' < "$f" | grep -aE "$PHASE_LINES" | grep -v "GET /health" > "$OUT/cold_$(basename "$f" .log)_phases.log"
  done
}

first_burst_kernel() {  # FlashInfer's GDN prefill paths, each first call against its second, in a fresh process
  setup vllm
  run "$OUT/first_call.out" "$(left 5)" python3 benchmarks/first_burst.py kernel --out "$OUT"
  [ -n "$DRY" ] || cat "$OUT/first_call.out"
}

first_burst() {  # ROLE WARMUP: launch (single or all) at its CUDA defaults, warm-up on or off, a first burst of 32
  # and the same lengths again, then stop (benchmarks/first_burst.py)
  setup vllm; [ "$1" = all ] && need_nixl
  model_60_layers
  run "$OUT/first_burst_$1_$2.out" "$(left 5)" python3 benchmarks/first_burst.py served --role "$1" --warmup "$2" \
    --start-timeout "$(left 120)" --out "$OUT"
  [ -n "$DRY" ] || tail -c 3000 "$OUT/first_burst_$1_$2.out"
  pack  # the engine logs under runs/ too (at most 8 files come back)
}

ray_check() {  # no engine, no cluster: what a served Ray run would meet first (ray 2.58 here, 2.60 in CI)
  setup vllm ray
  run "$OUT/ray_check.out" "$(left 5)" python3 benchmarks/ray_h200_check.py --out "$OUT/ray_check.json"
  [ -n "$DRY" ] || cat "$OUT/ray_check.json"
}

case "$stage" in
  copy-bundle) copy_bundle "$@" ;;
  prepare) prepare ;;
  kernels) kernels "$@" ;;
  kernels-flashqla) kernels_flashqla "$@" ;;
  tuned-serving) tuned_serving "$@" ;;
  transfer) transfer "$@" ;;
  serve) serve "$@" ;;
  validate) validate "$@" ;;
  fallback-warning) fallback_warning "$@" ;;
  served-start) served_step start ;;
  served-bench) served_step bench ;;
  served-faults) served_step faults ;;
  served-stop) served_step stop ;;
  chaos) chaos "$@" ;;
  lease-burst) lease_burst "$@" ;;
  equal-resources) equal_resources "$@" ;;
  dead-peer) dead_peer "$@" ;;
  ipc-cache-cost) ipc_cache_cost "$@" ;;
  cold-start) cold_start "$@" ;;
  ray-check) ray_check ;;
  first-burst-kernel) first_burst_kernel ;;
  first-burst) first_burst "$@" ;;
  *) echo "stage: copy-bundle, prepare, kernels, kernels-flashqla, tuned-serving, transfer, serve, validate," \
       "fallback-warning, served-start, served-bench, served-faults, served-stop, cold-start, chaos, lease-burst," \
       "equal-resources, dead-peer, ipc-cache-cost, ray-check, first-burst-kernel or first-burst" \
       "(got '${stage}')"; exit 2 ;;
esac
