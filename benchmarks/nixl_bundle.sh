#!/usr/bin/env bash
# nixl 1.5.1 alone for the H200 (BENCHMARKS.md, "H200 runs"): DEST/nixl_only.tgz, carried by
# `bash benchmarks/h200.sh copy-bundle nixl DEST` and unpacked by benchmarks/gpu_env.sh (nixl_site). The folders are
# the ones ../shared/gpu/README.md names (.nixl_cu13.mesonpy.libs holds libnixl.so); the UCX perftest is left out.
#   usage: bash benchmarks/nixl_bundle.sh [DEST]      (default .gpu/nx; DEST must be git-ignored)
set -euo pipefail
DEST=${1:-.gpu/nx}
NIXL=${NIXL:-1.5.1}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$work/whl" "nixl==$NIXL" "nixl-cu13==$NIXL" 2>&1 | grep -v 'is ignored' || true
mkdir -p "$work/site" "$DEST"
for w in "$work"/whl/*.whl; do (cd "$work/site" && python3 -m zipfile -e "$w" .); done
rm -rf "$work"/site/nixl_cu13.libs/ucx/libucx_perftest* "$work/site/nixl_ep_cu13"
(cd "$work/site" && tar czf - ./nixl ./nixl_cu13 ./nixl_cu13.libs ./.nixl_cu13.mesonpy.libs ./nixl_meta_utils.py) \
  > "$DEST/nixl_only.tgz"
du -sh "$DEST/nixl_only.tgz"
