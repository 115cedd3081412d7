#!/usr/bin/env bash
# The README's first command: install, build, make and pack a MoE model, serve it with a cache
# smaller than the model, drive it with an engine-shaped workload, show the stats, stop cleanly.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)"

mkdir -p demo
if [ ! -f demo/demo-moe.manifest.json ]; then
  # 4 MoE layers x 64 experts (top-8), Q8_0: a 110 MB model whose experts stream from disk.
  build/pack/expert-pack synth --dims 512,4,64,8,256,8,2,2048 --type Q8_0 --out demo/demo-moe.gguf
  build/pack/expert-pack build demo/demo-moe.gguf --verify
fi

sock=demo/expertd.sock
echo "== starting expertd with a 32 MiB cache for a $(du -h demo/demo-moe.expertpack | cut -f1) pack"
build/daemon/expertd --manifest demo/demo-moe.manifest.json --socket "$sock" --config /dev/null \
  --cache-mib 32 --reserve-mib 256 --clients-max 2 --lock-memory false --log-level warn &
pid=$!
trap 'kill -TERM $pid 2>/dev/null || true' EXIT
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done

echo "== an engine-shaped workload: 300 tokens, top-8 of 64 experts per layer, Zipf popularity"
build/bench/expert-bench sim --socket "$sock" --tokens 300 --top-k 8

echo "== expertctl stats"
build/client/expertctl --socket "$sock" stats

kill -TERM $pid
wait $pid
trap - EXIT
echo "== expertd stopped cleanly"
