# Sourced on the H200 (see benchmarks/gpu_chain.md): vLLM 0.26 from the ../shared/gpu/vllm bundle, nixl from
# .gpu/nx, and this checkout as the `hybridserve` distribution (its vLLM plugin is found by entry point).
# $1: the folder holding this checkout (the copy that travelled under .gpuwork/hs).
HS_SRC=$(cd "${1:-.gpuwork/hs}" && pwd)
if [ ! -f /tmp/vsite/.hs_ok ]; then
  bash /tmp/vbstash/install.sh > /tmp/install.log 2>&1 && touch /tmp/vsite/.hs_ok || { tail -5 /tmp/install.log; return 1; }
fi
source /tmp/vb_env.sh
# nixl only where its stash was copied (the P/D runs); the serving and kernel stages need none
if [ ! -f /tmp/nixlsite/.hs_ok ] && [ -f /tmp/nxstash/nixl_only.tgz ]; then
  mkdir -p /tmp/nixlsite && tar xzf /tmp/nxstash/nixl_only.tgz -C /tmp/nixlsite && touch /tmp/nixlsite/.hs_ok
fi
mkdir -p /tmp/hsite/hybridserve-0.1.0.dist-info
ln -sfn "$HS_SRC" /tmp/hsite/hybridserve
printf 'Metadata-Version: 2.1\nName: hybridserve\nVersion: 0.1.0\n' > /tmp/hsite/hybridserve-0.1.0.dist-info/METADATA
printf '[vllm.general_plugins]\nhybridserve = hybridserve.core.vllm_plugin:register\n' \
  > /tmp/hsite/hybridserve-0.1.0.dist-info/entry_points.txt
export PYTHONPATH=/tmp/hsite:$PYTHONPATH:/tmp/nixlsite PYTHONUNBUFFERED=1 COLUMNS=200
hs() { python3 -c "from hybridserve.cli.app import main; main()" "$@"; }
