#!/usr/bin/env bash
# The offline Ray bundle for `launch --engine ray` on the H200 (issue 41, point 5), beside the vLLM 0.26 bundle of
# ../shared/gpu/vllm (install that first): the wheels of scripts/ray_h200_requirements.txt (30, 161 MiB; ray
# 2.58.0 and pyarrow are most of it), cut into part folders of at most 46 MB (a wheel larger than that in pieces).
#   usage (project root; DEST git-ignored, e.g. '/.rb/' in .git/info/exclude):  scripts/ray_h200_bundle.sh [DEST]
# Then one `run` per part folder, back to back (the machine stays warm ~30 s between calls):
#   run(command="mkdir -p /tmp/rbstash && cp DEST/partNN/* /tmp/rbstash/", carry=["DEST/partNN"])
# and in the call that serves (after the vLLM bundle's install):
#   bash /tmp/rbstash/install.sh && export PYTHONPATH=/tmp/rsite:$PYTHONPATH PATH=/tmp/rsite/bin:$PATH
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
DEST=${1:-.rb}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 \
  --platform manylinux1_x86_64 -d "$work/wheels" -r "$here/ray_h200_requirements.txt" 2>&1 | grep -v 'is ignored' || true
rm -rf "$DEST"
python3 - "$work/wheels" "$DEST" <<'PY'
import os, sys
src, dest, limit = sys.argv[1], sys.argv[2], 46_000_000
pieces = []  # (name, bytes)
for name in sorted(os.listdir(src)):
    data = open(os.path.join(src, name), "rb").read()
    chunks = [data[i:i + limit] for i in range(0, len(data), limit)]
    pieces += [(name if len(chunks) == 1 else f"{name}.piece{k:02d}", c) for k, c in enumerate(chunks)]
parts, size = [[]], 0
for name, data in sorted(pieces, key=lambda p: -len(p[1])):  # first fit, largest first
    part = next((p for p in parts if sum(len(d) for _, d in p) + len(data) <= limit), None)
    if part is None:
        parts.append(part := [])
    part.append((name, data))
for i, part in enumerate(parts, 1):
    os.makedirs(f"{dest}/part{i:02d}")
    for name, data in part:
        open(f"{dest}/part{i:02d}/{name}", "wb").write(data)
install = """#!/usr/bin/env bash
# Joins the pieces in /tmp/rbstash, then installs every wheel there into /tmp/rsite (no index, no dependencies).
set -euo pipefail
cd /tmp/rbstash
for first in *.piece00; do [ -e "$first" ] || continue; whl=${first%.piece00}; cat "$whl".piece* > "$whl"; rm "$whl".piece*; done
test "$(ls *.whl | wc -l)" = "COUNT" || { echo "missing wheels: copy every part first"; exit 2; }
python3 -m pip install -q --no-index --no-deps --target /tmp/rsite *.whl
""".replace("COUNT", str(len(os.listdir(src))))
open(f"{dest}/part01/install.sh", "w").write(install)
print(f"{len(parts)} parts, {len(os.listdir(src))} wheels")
PY
du -sh "$DEST"/part*
