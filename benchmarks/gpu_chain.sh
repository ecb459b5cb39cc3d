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
*) echo "stage a, c, f or t"; exit 2 ;;
esac
