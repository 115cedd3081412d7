#!/usr/bin/env bash
# Decode with every expert in memory: expert-run --local (the experts read from the engine's own
# interleaved copies) against expert-run through expertd, its cache holding the whole model, from
# a pack in rows (as the GGUF stores them) and from one built with --layout rows8 (the types with
# interleaved rows stored that way). A Qwen3-30B-A3B-shaped synthetic model (4 layers) in Q4_K,
# Q2_K with Q3_K down (Kimi-K3's mix), MXFP4 experts (DeepSeek-V4-Flash's), Q8_0, IQ4_XS, Q5_K, Q4_0,
# IQ4_NL, Q6_K, Q4_K with Q6_K down (as Q4_K_M files hold their down projections), NVFP4, Q1_0 or TQ2_0; each run
# decodes (and prefills 256 tokens) after a warm-up run and bench/fill-cache.sh have put every
# expert in the daemon's cache (no read is left; a note says if a timed run missed); the three runs
# alternate (their order turning each round), ROUNDS rounds, medians and the ratios to --local
# (prefill: rows8 to rows). On the AVX2 kernels and, where the CPU has AVX-512 VNNI, the AVX-512
# ones; the CPU and the ISA are printed with every figure.
#   bash bench/layout.sh [rounds] [types...]     (types: q4_k q2_k mxfp4 q8_0 iq4_xs q5_k q4_0 iq4_nl
#                                                   q6_k q4_k_m nvfp4 q1_0 tq2_0)
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/fill-cache.sh
B=${B:-build}
ROUNDS=${1:-5}
shift $(($# < 1 ? $# : 1))
DIR=${LAYOUT_DIR:-/tmp/layout-bench}
N_GEN=${N_GEN:-64}
mkdir -p "$DIR"
declare -A MIX=(
  [q4_k]="--type Q4_K"
  [q2_k]="--type Q2_K --down-type Q3_K"
  [mxfp4]="--type Q8_0 --gate-type MXFP4 --up-type MXFP4 --down-type MXFP4"
  [q8_0]="--type Q8_0"
  [iq4_xs]="--type IQ4_XS"
  [q5_k]="--type Q5_K"
  [q4_0]="--type Q4_0"
  [iq4_nl]="--type IQ4_NL"
  [q6_k]="--type Q6_K"
  [q4_k_m]="--type Q4_K --down-type Q6_K"
  [nvfp4]="--type NVFP4"
  [q1_0]="--type Q1_0"
  [tq2_0]="--type TQ2_0"
)
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(q4_k q2_k mxfp4 q8_0)
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
passes=avx2
grep -q avx512_vnni /proc/cpuinfo && passes="avx2 avx512"
passes=${PASSES:-$passes}
pids=()
cleanup() { for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
tok_s() { python3 -c 'import json, sys; j = json.load(sys.stdin); print(j["decode_tok_s"], j["prefill_tok_s"])'; }
for name in "${names[@]}"; do
  m="$DIR/q30b-4l-$name"
  [ -f "$m.gguf" ] || "$B/pack/expert-pack" -q synth --preset qwen3-30b-a3b --layers 4 ${MIX[$name]} --out "$m.gguf" >/dev/null
  for layout in rows rows8; do
    mkdir -p "$m-$layout"
    [ -f "$m-$layout/q30b-4l-$name.manifest.json" ] ||
      "$B/pack/expert-pack" -q build --layout "$layout" --out "$m-$layout" "$m.gguf" >/dev/null
  done
  slots=$(python3 -c "import json; m = json.load(open('$m-rows/q30b-4l-$name.manifest.json')); print(len(m['layers']) * m['n_experts'] + 64)")
  for kernels in $passes; do
    export EXPERTD_KERNELS=$kernels
    declare -A socks=()
    for layout in rows rows8; do
      sock="$DIR/$name-$layout.sock"
      "$B/daemon/expertd" --manifest "$m-$layout/q30b-4l-$name.manifest.json" --socket "$sock" \
        --config /dev/null --cache-slots "$slots" --clients-max 2 --reserve-mib 256 \
        --lock-memory false --log-level warn &
      pids+=($!)
      for _ in $(seq 200); do [ -S "$sock" ] && break; sleep 0.05; done
      socks[$layout]=$sock
      # warm-up: a run, then every expert read into the cache, so the timed runs read nothing
      "$B/engine/expert-run" bench --model "$m-$layout/q30b-4l-$name.core.gguf" --socket "$sock" \
        --threads "$(nproc)" -p 512 -n 256 --json >/dev/null
      fill_cache "$sock" "$m-$layout/q30b-4l-$name.manifest.json"
    done
    misses0="$(cache_misses "${socks[rows]}") $(cache_misses "${socks[rows8]}")"
    : > "$DIR/runs"
    for r in $(seq "$ROUNDS"); do
      order=(local rows rows8)
      for i in 0 1 2; do  # the order turns each round: no run always follows the same one
        what=${order[$(((i + r) % 3))]}
        if [ "$what" = local ]; then
          j=$("$B/engine/expert-run" bench --model "$m.gguf" --local --threads "$(nproc)" -p 256 -n "$N_GEN" --json)
        else
          j=$("$B/engine/expert-run" bench --model "$m-$what/q30b-4l-$name.core.gguf" \
            --socket "${socks[$what]}" --threads "$(nproc)" -p 256 -n "$N_GEN" --json)
        fi
        echo "$r $what $(tok_s <<<"$j")" >> "$DIR/runs"
      done
    done
    misses1="$(cache_misses "${socks[rows]}") $(cache_misses "${socks[rows8]}")"
    [ "$misses0" = "$misses1" ] ||
      echo "  note: the timed runs missed the cache (misses rows, rows8: $misses0 -> $misses1)"
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    pids=()
    loc=$(awk '$2 == "local" {print $3}' "$DIR/runs" | median)
    rows=$(awk '$2 == "rows" {print $3}' "$DIR/runs" | median)
    rows8=$(awk '$2 == "rows8" {print $3}' "$DIR/runs" | median)
    # ratios per round, then their median
    ratio() {  # per round, column $2 of $1 over --local's, then their median
      awk -v w="$1" -v c="$2" '{v[$1" "$2]=$c} END {for (k in v) {split(k, a, " "); if (a[2] == w) print v[k] / v[a[1]" local"]}}' "$DIR/runs" | median
    }
    p_rows=$(awk '$2 == "rows" {print $4}' "$DIR/runs" | median)
    p_rows8=$(awk '$2 == "rows8" {print $4}' "$DIR/runs" | median)
    printf '%-6s %-6s decode tok/s: --local %.1f, expertd rows %.1f (%.2fx), expertd rows8 %.1f (%.2fx); prefill-256: rows %.0f, rows8 %.0f (%.2fx rows)  [%s rounds, %s]\n' \
      "$name" "$kernels" "$loc" "$rows" "$(ratio rows 3)" "$rows8" "$(ratio rows8 3)" "$p_rows" "$p_rows8" \
      "$(awk '{v[$1" "$2]=$4} END {for (k in v) {split(k, a, " "); if (a[2] == "rows8") print v[k] / v[a[1]" rows"]}}' "$DIR/runs" | median)" "$ROUNDS" "$cpu"
  done
done
