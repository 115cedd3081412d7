#!/usr/bin/env bash
# The README's first command: install, build, pack the bundled MoE model, serve its experts
# through expertd with a cache smaller than the model, generate a paragraph, show the stats,
# stop the daemon cleanly.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
source scripts/cuda-env.sh
source scripts/step.sh
step cmake "configuring (cmake)" cmake -S . -B build -G Ninja \
  -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-Release} -DEXPERTD_CUDA=${EXPERTD_CUDA:-AUTO} \
  -DEXPERTD_WERROR=${EXPERTD_WERROR:-OFF} -DEXPERTD_REQUIRE_GOLDEN=${EXPERTD_REQUIRE_GOLDEN:-OFF}
step build "building ($(nproc) jobs; about 10 min on 2 cores, 25 with the CUDA tier)" \
  cmake --build build -j"$(nproc)"

mkdir -p demo
cp -f model/kjv-moe-q8_0.gguf demo/kjv.gguf
echo "== expert-pack build: the bundled model into a core GGUF and an expert pack (in the layout of"
echo "   expert-run's CPU kernels: --layout rows8)"
build/pack/expert-pack build demo/kjv.gguf --layout rows8 --verify

sock=demo/expertd.sock
echo "== expertd: 48 expert slots for a model of 4 layers x 32 experts (the cache holds 3/8 of it)"
build/daemon/expertd --manifest demo/kjv.manifest.json --socket "$sock" --config /dev/null \
  --cache-slots 48 --clients-max 2 --reserve-mib 256 --lock-memory false --log-level warn &
pid=$!
trap 'kill -TERM $pid 2>/dev/null || true' EXIT
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done

echo "== expert-run generate (experts streamed from the pack through expertd)"
build/engine/expert-run generate --model demo/kjv.core.gguf --socket "$sock" \
  --prompt "And God said" -n 160 --temp 0.7 --top-k 40 --top-p 0.95 --seed 3 --prefetch --verbose

echo "== expertctl stats"
build/client/expertctl --socket "$sock" stats

kill -TERM $pid
wait $pid
trap - EXIT
echo "== expertd stopped cleanly"
