#!/usr/bin/env bash
# The H200 chain of issue 14, one stage per device call (BENCHMARKS.md "CUDA hosts" gives the numbers).
# Before: 8 copy calls (vLLM 0.26 bundle parts 01-08 into /tmp/vbstash, nixl_only.tgz into /tmp/nxstash).
#   bash benchmarks/gpu_chain.sh a   # install; (a) transfer bench --memory vram; READ vs WRITE; (b)+(d) P/D vs one server
#   bash benchmarks/gpu_chain.sh c   # (c) validate single-sync vs pd-async on the GPU
#   bash benchmarks/gpu_chain.sh f   # (c) the same with an injected fault: must exit 1
# Run from the folder that holds this checkout's copy (.gpuwork/hs); results go to $OUT.
set -o pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
if [ "$1" = t ]; then  # transfer only: nixl from the carried .gpu/nx, no vLLM
  mkdir -p /tmp/nixlsite /tmp/hsite && tar xzf "$here/../../.gpu/nx/nixl_only.tgz" -C /tmp/nixlsite && ln -sfn "$here" /tmp/hsite/hybridserve
  export PYTHONPATH=/tmp/hsite:/tmp/nixlsite PYTHONUNBUFFERED=1 COLUMNS=200
else
  source "$here/benchmarks/gpu_env.sh" "$here" || exit 3
fi
cd "$here"
BENCH=(python3 -c "from hybridserve.cli.app import main; main()" transfer bench -m qwen3.5-397b-a17b --mamba-ssm-cache-dtype bfloat16 --memory vram --json)
GDN=(--gdn-prefill-backend triton)   # the bundle's parts 09-10 (cutlass-dsl, FlashInfer's GDN prefill) stay home
case "$1" in
a)
  { date -u; nvidia-smi -L; python3 -c "import vllm, nixl._api, hybridserve, importlib.metadata as m; print('vllm', vllm.__version__, hybridserve.__file__, [e.name for e in m.entry_points(group='vllm.general_plugins')])"; } 2>&1 | tee "$OUT/env.txt"
  echo "== (a) transfer bench --memory vram" | tee -a "$OUT/env.txt"
  timeout 300 python3 -c "from hybridserve.cli.app import main; main()" transfer bench -m qwen3.5-397b-a17b \
    --mamba-ssm-cache-dtype bfloat16 --memory vram --json --ucx-log "$OUT/ucx_bench.log" > "$OUT/bench_vram.json" 2>> "$OUT/env.txt"
  echo "bench rc=$?" | tee -a "$OUT/env.txt"
  echo "== READ vs WRITE" | tee -a "$OUT/env.txt"
  timeout 120 python3 benchmarks/ucx_direction_gpu.py > "$OUT/direction.json" 2>> "$OUT/env.txt"; echo "direction rc=$?" | tee -a "$OUT/env.txt"
  echo "== (b)+(d) launch --role all --device cuda" | tee -a "$OUT/env.txt"
  timeout 420 python3 benchmarks/pd_gpu.py --out "$OUT" -- "${GDN[@]}" 2>&1 | tail -40
  ;;
c|f)
  name=validate_clean; extra=()
  if [ "$1" = f ]; then name=validate_fault; extra=(--fault early_completion --num-prompts 32); fi
  timeout 560 python3 -c "from hybridserve.cli.app import main; main()" validate --device cuda --enforce-eager \
    "${GDN[@]}" --run-dir /tmp/hs-val --json "${extra[@]}" > "$OUT/$name.json" 2> "$OUT/$name.err"
  rc=$?; echo "$name rc=$rc" | tee -a "$OUT/$name.err"
  for f in $(ls -t /tmp/hs-val/*/decode-0.log /tmp/hs-val/*/single-0.log 2>/dev/null | head -3); do
    echo "===== $f"; grep -E "hybridserve|KV Transfer|Error|error|Traceback" "$f" | tail -30; tail -15 "$f"
  done > "$OUT/${name}_logs.txt" 2>&1
  tail -5 "$OUT/$name.err"
  ;;
t)
  { date -u; nvidia-smi -L; } > "$OUT/env.txt" 2>&1
  echo "== (a) default settings" >> "$OUT/env.txt"
  timeout 240 "${BENCH[@]}" --ucx-log "$OUT/ucx_bench.log" > "$OUT/bench_vram.json" 2>> "$OUT/env.txt"; echo "rc=$?" >> "$OUT/env.txt"
  echo "== get_zcopy off (the TCP fallback, marked)" >> "$OUT/env.txt"
  UCX_CUDA_IPC_ENABLE_GET_ZCOPY=n timeout 120 "${BENCH[@]}" --prompt-len 32768 --requests 1 \
    --ucx-log "$OUT/ucx_bench_fallback.log" > "$OUT/bench_vram_fallback.json" 2>> "$OUT/env.txt"; echo "rc=$?" >> "$OUT/env.txt"
  COLUMNS=200 UCX_CUDA_IPC_ENABLE_GET_ZCOPY=n timeout 120 python3 -c "from hybridserve.cli.app import main; main()" transfer bench \
    -m qwen3.5-397b-a17b --mamba-ssm-cache-dtype bfloat16 --memory vram --prompt-len 1024 --requests 1 >> "$OUT/env.txt" 2>&1
  echo "== READ vs WRITE" >> "$OUT/env.txt"
  timeout 150 python3 benchmarks/ucx_direction_gpu.py > "$OUT/direction.json" 2>> "$OUT/env.txt"; echo "rc=$?" >> "$OUT/env.txt"
  tail -30 "$OUT/env.txt"
  ;;
w)  # launch's TCP-fallback warning, live: a healthy start, then get_zcopy switched off in the topology
  cat > /tmp/fallback.yaml <<YAML
model: $here/profiles/tiny-qwen3.5-recall
device: cuda
engine: {enforce_eager: true, gdn_prefill_backend: triton}
prefill: [{port: 8100, side_channel_port: 8150, devices: [0], env: {UCX_CUDA_IPC_ENABLE_GET_ZCOPY: "n"}}]
decode: [{port: 8200, side_channel_port: 8250, devices: [0], env: {UCX_CUDA_IPC_ENABLE_GET_ZCOPY: "n"}}]
proxy: {port: 8000}
YAML
  body='{"model":"tiny-qwen3.5-recall","prompt":"S01 a b S02 c d S01 e f","max_tokens":4,"temperature":0}'
  for name in healthy fallback; do
    if [ $name = healthy ]; then args=(--model profiles/tiny-qwen3.5-recall --enforce-eager "${GDN[@]}"); else args=(--topology /tmp/fallback.yaml); fi
    python3 -c "from hybridserve.cli.app import main; main()" launch --role all --device cuda --run-dir /tmp/hs-w \
      "${args[@]}" > "$OUT/$name.out" 2> "$OUT/$name.err" &
    pid=$!; t0=$(date +%s)
    for i in $(seq 1 200); do curl -sf localhost:8000/health > /dev/null && break; sleep 2; done
    echo "$name healthy after $(( $(date +%s) - t0 )) s" >> "$OUT/${name}_decode_ucx.txt"
    for i in 1 2 3; do curl -s localhost:8000/v1/completions -H 'content-type: application/json' -d "$body"; echo; done >> "$OUT/${name}_decode_ucx.txt"
    sleep 8; kill -TERM $pid; wait $pid; echo "$name launch rc=$?" >> "$OUT/${name}_decode_ucx.txt"
    grep -h "|" $(ls -td /tmp/hs-w/*/ | head -1)decode-0.log | grep -A4 "remote memory read" >> "$OUT/${name}_decode_ucx.txt"
    grep -h "NIXL received" $(ls -td /tmp/hs-w/*/ | head -1)decode-0.log | tail -3 >> "$OUT/${name}_decode_ucx.txt"
  done
  grep -h "warning\|healthy after\|rc=" "$OUT"/*.err "$OUT"/*_decode_ucx.txt
  ;;
*) echo "stage a, c, f, t or w"; exit 2 ;;
esac
