#!/usr/bin/env bash
# Records the expert trace of a 2,000-token generation of the bundled model through expertd
# (--trace-path), keeps it compressed in model/trace/, and writes the routing report:
# per-layer expert popularity and lru / lfu / lfru / Belady hit rates at 10, 25, 50% caches.
set -euo pipefail
cd "$(dirname "$0")/.."
# usage: record_trace.sh [MODEL [NAME]]: NAME names the files (default: the bundled model's).
model=${1:-model/kjv-moe-q8_0.gguf}
name=${2:-kjv-2000-tokens}
report=model/trace/policy-report.txt
[ "$name" = kjv-2000-tokens ] || report=model/trace/$name-policy-report.txt
work=$(mktemp -d)
trap 'kill -TERM $pid 2>/dev/null || true; rm -rf "$work"' EXIT
cp "$model" "$work/m.gguf"
build/pack/expert-pack -q build "$work/m.gguf" >/dev/null
build/daemon/expertd --manifest "$work/m.manifest.json" --socket "$work/s.sock" --config /dev/null \
  --cache-slots 64 --clients-max 1 --lock-memory false --log-level warn --trace-path "$work/trace.bin" &
pid=$!
for _ in $(seq 100); do [ -S "$work/s.sock" ] && break; sleep 0.05; done
prompts=("In the beginning God created" "And the LORD spake unto Moses, saying," "Blessed are the poor in spirit:"
         "And it came to pass, when the king" "The LORD is my shepherd;" "And Jesus answered and said unto them,"
         "Praise ye the LORD." "Now the serpent was more subtil")
seed=1
for p in "${prompts[@]}"; do
  build/engine/expert-run generate --model "$work/m.core.gguf" --socket "$work/s.sock" --prompt "$p" -n 250 \
    --temp 0.8 --top-k 40 --top-p 0.95 --seed $seed --ctx 260 >/dev/null
  seed=$((seed + 1))
done
kill -TERM $pid
wait $pid
mkdir -p model/trace
gzip -9 -n -c "$work/trace.bin" > "model/trace/$name.trace.gz"
{
  echo "# Routing of $(basename "$model"): 8 prompts x 250 generated tokens (temperature 0.8, seeds 1-8)"
  echo "# recorded by model/record_trace.sh; replay: expert-bench policy --trace <(zcat model/trace/$name.trace.gz)"
  build/bench/expert-bench policy --trace "$work/trace.bin" | sed "s|$work/trace.bin|model/trace/$name.trace (gunzipped)|"
} > "$report"
cat "$report"
