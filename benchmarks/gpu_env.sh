# The installs of the H200 runs, sourced by benchmarks/h200.sh (BENCHMARKS.md, "H200 runs"); each runs once a
# machine (a marker file in /tmp), later calls on the same warm machine only set the environment.
# What they read, left in /tmp by `bash benchmarks/h200.sh copy-bundle KIND FOLDER` calls:
#   /tmp/vbstash   vLLM 0.26 (CUDA) bundle: ../shared/gpu/vllm/build.sh .vb, parts 01-10 (09-10: FlashInfer's GDN
#                  prefill and cutlass-dsl; without them serve with --gdn-prefill-backend triton)
#   /tmp/nxstash   nixl_only.tgz (nixl 1.5.1 alone, beside vLLM's FlashInfer: ../shared/gpu/README.md)
#   /tmp/rbstash   Ray Serve LLM's wheels for `launch --engine ray` (ray 2.58.0, the release whose llm code imports
#                  vLLM 0.26: scripts/ray_h200_bundle.sh .rb, parts 01-04 or so)
#   /tmp/fqstash   fla.tgz (fla-core 0.6.0) and FlashQLA's wheels (flash-qla 0.1.3, tilelang 0.1.15,
#                  apache-tvm-ffi 0.1.12, z3-solver, torch-c-dlpack-ext)
# $1: the checkout that becomes the `hybridserve` distribution (default: the current folder).
HS_SRC=$(cd "${1:-.}" && pwd)

# this checkout as the `hybridserve` distribution: import path, and the entry point that loads its vLLM plugin
hs_site() {
  mkdir -p /tmp/hsite/hybridserve-0.1.0.dist-info
  ln -sfn "$HS_SRC" /tmp/hsite/hybridserve
  printf 'Metadata-Version: 2.1\nName: hybridserve\nVersion: 0.1.0\n' > /tmp/hsite/hybridserve-0.1.0.dist-info/METADATA
  printf '[vllm.general_plugins]\nhybridserve = hybridserve.core.vllm_plugin:register\n' \
    > /tmp/hsite/hybridserve-0.1.0.dist-info/entry_points.txt
}

# nixl alone, where its stash was copied (the P/D and transfer runs; the kernel runs need none)
nixl_site() {
  if [ ! -f /tmp/nixlsite/.hs_ok ] && [ -f /tmp/nxstash/nixl_only.tgz ]; then
    mkdir -p /tmp/nixlsite && tar xzf /tmp/nxstash/nixl_only.tgz -C /tmp/nixlsite && touch /tmp/nixlsite/.hs_ok
  fi
}

# vLLM 0.26 with its FlashInfer, nixl beside it, this checkout
install_vllm() {
  if [ ! -f /tmp/vsite/.hs_ok ]; then
    bash /tmp/vbstash/install.sh > /tmp/install.log 2>&1 && touch /tmp/vsite/.hs_ok \
      || { tail -5 /tmp/install.log; return 1; }
  fi
  source /tmp/vb_env.sh
  nixl_site; hs_site
  export PYTHONPATH=/tmp/hsite:$PYTHONPATH:/tmp/nixlsite PYTHONUNBUFFERED=1 COLUMNS=200
}

# nixl and this checkout only, no vLLM (transfer bench, READ against WRITE)
install_nixl() {
  nixl_site; hs_site
  [ -f /tmp/nixlsite/.hs_ok ] || { echo "no /tmp/nxstash/nixl_only.tgz: copy-bundle nixl first"; return 1; }
  export PYTHONPATH=/tmp/hsite:/tmp/nixlsite PYTHONUNBUFFERED=1 COLUMNS=200
}

# Ray Serve LLM beside vLLM (after install_vllm): `launch --engine ray` starts its nodes with this interpreter, and
# its workers inherit the path
install_ray() {
  if [ ! -f /tmp/rsite/.hs_ok ]; then
    bash /tmp/rbstash/install.sh > /tmp/ray_install.log 2>&1 && touch /tmp/rsite/.hs_ok \
      || { tail -5 /tmp/ray_install.log; return 1; }
  fi
  export PYTHONPATH=$PYTHONPATH:/tmp/rsite
}

# fla-core beside vLLM's FlashInfer (after install_vllm): the fla backend of verify and tune
install_fla() {
  if [ ! -f /tmp/flasite/.hs_ok ]; then
    mkdir -p /tmp/flasite && tar xzf /tmp/fqstash/fla.tgz -C /tmp/flasite && touch /tmp/flasite/.hs_ok || return 1
  fi
  export PYTHONPATH=$PYTHONPATH:/tmp/flasite FLA_DISABLE_BACKEND_DISPATCH=1
}

# FlashQLA's own environment: its apache-tvm-ffi pin clashes with vLLM's FlashInfer (0.1.12 against ==0.1.10), so
# its wheels go first on the path; vLLM's site, where installed, last (pure-Python helpers only)
install_flashqla() {
  if [ ! -f /tmp/fqsite/.hs_ok ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/fqsite \
      /tmp/fqstash/*.whl > /tmp/fq_install.log 2>&1 && touch /tmp/fqsite/.hs_ok \
      || { tail -5 /tmp/fq_install.log; return 1; }
  fi
  hs_site
  export PYTHONPATH=/tmp/fqsite:/tmp/hsite:/tmp/vsite PYTHONUNBUFFERED=1 COLUMNS=200 \
    TILELANG_CACHE_DIR=/tmp/tlcache
}
