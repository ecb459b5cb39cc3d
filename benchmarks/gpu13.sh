#!/usr/bin/env bash
# The H200 runs of issue 13 (tuned kernels reach the server), one stage per device call, back to back.
# Before: copy calls for the vLLM 0.26 bundle (parts 01-10 into /tmp/vbstash, see ../shared/gpu/README.md) and
# .gpuwork/fq1 (z3-solver wheel + fla.tgz, fla-core 0.6.0 unpacked) into /tmp/fqstash.
#   bash benchmarks/gpu13.sh k   # install; tune fla + FlashInfer (vLLM 0.26's) over 4 TPs x 5 shapes -> $OUT/fi
#   bash benchmarks/gpu13.sh q   # carry .gpuwork/fq2 (tilelang, apache-tvm-ffi 0.1.12, flash-qla): verify + tune
#                                # FlashQLA in its own environment -> $OUT/fq
#   bash benchmarks/gpu13.sh s   # merge the two profiles; make the TP2-geometry model; served TTFT, mix throughput
#                                # and greedy tokens, --tuned-profile against vLLM's default -> $OUT/serving
#   bash benchmarks/gpu13.sh r   # on a fresh machine after the bundle's copy calls: the served comparison with the
#                                # shipped profile (default, tuned and a control default at once on the GPU,
#                                # requests rotating), then
#                                # the routing's per-call cost (gdn_route_overhead_gpu.py)
#   bash benchmarks/gpu13.sh f   # a fresh machine, no vLLM: FlashQLA verify alone (fq1 copied first, fq2 carried)
#   bash benchmarks/gpu13.sh v   # after r, carry .gpuwork/fq2 (fq1's z3 wheel copied to /tmp/fqstash before): verify
#                                # FlashInfer (vLLM's) and FlashQLA (its own environment) on the whole case matrix,
#                                # and the per-call routing cost (gdn_route_overhead_gpu.py)
# Results also stay in /tmp/gpu13 for the next stage (the machine keeps /tmp while it stays warm).
# The ignored folders it reads, made here first (echo /.gpuwork/ >> .git/info/exclude):
#   .gpuwork/fq1: z3_solver-4.15.4.0 wheel + fla.tgz (./fla and its dist-info from ../shared/gpu/bundle.sh's site.tgz)
#   .gpuwork/fq2: tilelang 0.1.15, apache-tvm-ffi 0.1.12, torch-c-dlpack-ext 0.1.5, flash-qla 0.1.3 wheels
#   (pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 ...)
set -o pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
mkdir -p /tmp/gpu13
say() { echo "[$(date -u +%T)] $*" | tee -a "$OUT/stage.log"; }
# stages r and f: seconds left before DEADLINE (epoch s, default now + 540) less $1, at least 1 (timeout 0 never stops)
deadline=${DEADLINE:-$(( $(date +%s) + 540 ))}
left() { local s=$(( deadline - $(date +%s) - $1 )); echo $(( s > 1 ? s : 1 )); }
# FlashQLA's own environment: its wheels (.gpuwork/fq2, carried; fq1's copied before) into /tmp/fqsite
fq_install() {
  mkdir -p /tmp/fqstash && cp .gpuwork/fq2/* /tmp/fqstash/
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/fqsite /tmp/fqstash/*.whl \
    > "$OUT/pip.txt" 2>&1 || { tail -5 "$OUT/pip.txt"; exit 3; }
}
case "$1" in
k)
  source benchmarks/gpu_env.sh "$here" || exit 3
  mkdir -p /tmp/flasite && tar xzf /tmp/fqstash/fla.tgz -C /tmp/flasite
  export PYTHONPATH=$PYTHONPATH:/tmp/flasite FLA_DISABLE_BACKEND_DISPATCH=1
  { date -u; nvidia-smi -L; python3 -c "import importlib.metadata as m; print({d: m.version(d) for d in ('vllm', 'flashinfer-python', 'fla-core', 'torch', 'triton', 'apache-tvm-ffi', 'nvidia-cutlass-dsl')})"; } 2>&1 | tee "$OUT/env.txt"
  say "tune fla + flashinfer"
  timeout 480 python3 benchmarks/kernels_gpu.py --out "$OUT/fi" --backends fla flashinfer --skip-verify --budget-s 400 \
    > "$OUT/fi.out" 2>&1; say "rc=$?"
  cp -r "$OUT/fi" /tmp/gpu13/; tail -45 "$OUT/fi.out"
  ;;
q)
  fq_install
  ln -sfn "$here" /tmp/hsite/hybridserve
  # FlashQLA's own environment: its apache-tvm-ffi first; vLLM's site last (pure-Python helpers only, no FlashInfer)
  export PYTHONPATH=/tmp/fqsite:/tmp/hsite:/tmp/vsite PYTHONUNBUFFERED=1 COLUMNS=200 TILELANG_CACHE_DIR=/tmp/tlcache
  python3 -c "import flash_qla, tilelang, importlib.metadata as m; print({d: m.version(d) for d in ('flash-qla', 'tilelang', 'apache-tvm-ffi')})" 2>&1 | tee "$OUT/env.txt"
  say "verify + tune flashqla"
  cases=(len1 len65 len1000 zero-len-inside varlen init-state gva4
         qwen3.5-397b-a17b-tp1 qwen3.5-397b-a17b-tp2 qwen3.5-397b-a17b-tp4 qwen3.5-397b-a17b-tp8)
  timeout 560 python3 benchmarks/kernels_gpu.py --out "$OUT/fq" --backends flashqla --verify-backends torch flashqla \
    --verify-cases "${cases[@]}" --budget-s 520 > "$OUT/fq.out" 2>&1; say "rc=$?"
  cp -r "$OUT/fq" /tmp/gpu13/; tail -45 "$OUT/fq.out"
  ;;
s)
  source benchmarks/gpu_env.sh "$here" || exit 3
  if [ -f /tmp/gpu13/fq/h200.yaml ]; then
    hs tune --merge /tmp/gpu13/fi/h200.yaml --merge /tmp/gpu13/fq/h200.yaml --out /tmp/gpu13/h200.yaml \
      > "$OUT/merge.txt" 2>&1; say "merge rc=$?"; cat "$OUT/merge.txt"
  else
    cp /tmp/gpu13/fi/h200.yaml /tmp/gpu13/h200.yaml; say "no FlashQLA profile: serving the fla + FlashInfer one"
  fi
  cp /tmp/gpu13/h200.yaml* "$OUT/"
  python3 scripts/make_gdn_bench_model.py /tmp/gdn-tp2 --tp 2 > "$OUT/model.txt" 2>&1; say "model rc=$?"
  # the server's environment holds vLLM's FlashInfer, not FlashQLA's tilelang (apache-tvm-ffi pins clash): serve the
  # profile tuned in that environment, whose every winner can run there
  timeout 450 python3 benchmarks/tuned_serving.py --model /tmp/gdn-tp2 --profile /tmp/gpu13/fi/h200.yaml --device cuda \
    --tp 1 --ttft-prompts 6 --extra-arg=--enforce-eager --run-dir /tmp/hs-ts --out "$OUT/serving/tuned_serving.json" \
    > "$OUT/serving.out" 2>&1; say "serving rc=$?"
  mkdir -p "$OUT/serving"; for f in /tmp/hs-ts/*/*.log; do tail -c 60000 "$f" > "$OUT/serving/$(basename "$(dirname "$f")")-$(basename "$f")"; done
  tail -40 "$OUT/serving.out"
  ;;
r)  # a fresh machine after the bundle's copy calls: serving again with the merged profile (the server lacks
    # FlashInfer's rivals: FlashQLA buckets fall back along their ranked lists), three servers at once (default,
    # tuned, a control copy of the default); then, while DEADLINE (epoch s, default now + 540) leaves 30 s, the
    # routing's per-call cost. At most 7 files under $OUT.
  source benchmarks/gpu_env.sh "$here" || exit 3
  { nvidia-smi -L; python3 -c "import importlib.metadata as m; print({d: m.version(d) for d in ('vllm', 'flashinfer-python', 'torch', 'triton', 'nvidia-cutlass-dsl')})"; } >> "$OUT/stage.log" 2>&1
  say "installed"
  python3 scripts/make_gdn_bench_model.py /tmp/gdn-tp2 --tp 2 >> "$OUT/stage.log" 2>&1; say "model rc=$?"
  mkdir -p "$OUT/serving"
  timeout "$(left 20)" python3 benchmarks/tuned_serving.py --model /tmp/gdn-tp2 --profile profiles/tuned/h200.yaml \
    --device cuda --tp 1 --ttft-prompts 30 --greedy-tokens 16 --extra-arg=--enforce-eager --control --gpu-share 0.28 \
    --run-dir /tmp/hs-ts --out "$OUT/serving/tuned_serving.json" > "$OUT/serving.out" 2>&1; say "serving rc=$?"
  for f in /tmp/hs-ts/*/*.log; do grep -v "GET /health" "$f" | tail -c 40000 > "$OUT/serving/$(basename "$(dirname "$f")")_$(basename "$f")"; done
  tail -25 "$OUT/serving.out"
  # then, on the same machine, the per-call cost of the routing against vLLM's own call (run 3 gained 0.24 ms at
  # 1k where run 2's per-call numbers predicted 1.5 ms)
  if [ "$(left 10)" -gt 30 ]; then
    say "route overhead ($(left 10) s left)"
    timeout "$(left 10)" python3 benchmarks/gdn_route_overhead_gpu.py --profile profiles/tuned/h200.yaml \
      --out "$OUT/route_overhead.json" > /tmp/gpu13/route_overhead.out 2>&1; say "rc=$?"; tail -4 /tmp/gpu13/route_overhead.out
  else
    say "no time left for the route overhead"
  fi
  ;;
v)
  ( source benchmarks/gpu_env.sh "$here" || exit 3
    timeout 90 python3 benchmarks/gdn_route_overhead_gpu.py --profile profiles/tuned/h200.yaml \
      --out "$OUT/route_overhead.json" > "$OUT/route_overhead.out" 2>&1; say "overhead rc=$?"; tail -4 "$OUT/route_overhead.out"
    say "verify flashinfer"
    timeout 200 python3 -c "from hybridserve.cli.app import main; main()" verify --backend torch --backend flashinfer --json > "$OUT/verify_flashinfer.json" \
      2> "$OUT/verify_flashinfer.err"; say "rc=$?" )
  fq_install
  export PYTHONPATH=/tmp/fqsite:/tmp/hsite:/tmp/vsite PYTHONUNBUFFERED=1 COLUMNS=200 TILELANG_CACHE_DIR=/tmp/tlcache
  say "verify flashqla"
  timeout 330 python3 -c "from hybridserve.cli.app import main; main()" verify --backend torch --backend flashqla \
    --json > "$OUT/verify_flashqla.json" 2> "$OUT/verify_flashqla.err"; say "rc=$?"
  for f in "$OUT"/verify_*.err; do tail -5 "$f"; done
  ;;
f)  # a fresh machine, no vLLM: FlashQLA's verify alone in its own environment. Before: one copy call of .gpuwork/fq1
    # (mkdir -p /tmp/fqstash && cp .gpuwork/fq1/* /tmp/fqstash/: z3-solver, apache-tvm-ffi 0.1.12, torch-c-dlpack-ext,
    # flash-qla and tilelang's small pure dependencies); this stage carries .gpuwork/fq2 (tilelang 0.1.15).
  fq_install
  mkdir -p /tmp/hsite && ln -sfn "$here" /tmp/hsite/hybridserve
  export PYTHONPATH=/tmp/fqsite:/tmp/hsite PYTHONUNBUFFERED=1 COLUMNS=200 TILELANG_CACHE_DIR=/tmp/tlcache
  { nvidia-smi -L; python3 -c "import flash_qla, tilelang, importlib.metadata as m; print({d: m.version(d) for d in ('flash-qla', 'tilelang', 'apache-tvm-ffi', 'torch', 'triton')})"; } 2>&1 | tee "$OUT/stage.log"
  say "verify flashqla ($(left 10) s left)"
  timeout "$(left 10)" python3 -c "from hybridserve.cli.app import main; main()" verify --backend torch --backend flashqla \
    --json > "$OUT/verify_flashqla.json" 2> "$OUT/verify_flashqla.err"; say "rc=$?"
  tail -5 "$OUT/verify_flashqla.err"
  ;;
*) echo "stage k, q, s, r, v or f"; exit 2 ;;
esac
