#!/usr/bin/env bash
# Decode from expertd's slots in 2 MiB pages against 4 KiB pages: one rows8 pack (see
# bench/layout.sh) served by two daemons, --huge-pages true and false, every expert cached (a
# warm-up run, then bench/fill-cache.sh), against expert-run --local (the engine's own interleaved copies, in huge pages);
# 256-token prompt, 64 tokens, the three runs alternating (their order turning), ROUNDS rounds,
# medians of the per-round ratios to --local. Huge pages in shared memory need the host's leave:
# /sys/kernel/mm/transparent_hugepage/shmem_enabled "advise" (systemd/expertd-thp.conf); the
# script prints the setting and each daemon's arena_huge_bytes.
#   bash bench/arena_pages.sh [rounds] [types...]     (types: q4_k q2_k mxfp4 q8_0 iq4_xs q5_k)
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/fill-cache.sh
B=${B:-build}
ROUNDS=${1:-5}
shift $(($# < 1 ? $# : 1))
DIR=${LAYOUT_DIR:-/tmp/layout-bench}
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(q4_k iq4_xs)
# bench/layout.sh makes the models and packs; one round of it when they are missing
for name in "${names[@]}"; do
  [ -f "$DIR/q30b-4l-$name-rows8/q30b-4l-$name.manifest.json" ] || PASSES=avx2 N_GEN=8 bash bench/layout.sh 1 "$name" >/dev/null
done
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
policy=$(sed 's/.*\[\(.*\)\].*/\1/' /sys/kernel/mm/transparent_hugepage/shmem_enabled 2>/dev/null || echo absent)
echo "shmem_enabled: $policy"
passes=avx2
grep -q avx512_vnni /proc/cpuinfo && passes="avx2 avx512"
passes=${PASSES:-$passes}
pids=()
cleanup() { for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
decode() { python3 -c 'import json, sys; print(json.load(sys.stdin)["decode_tok_s"])'; }
for name in "${names[@]}"; do
  m="$DIR/q30b-4l-$name"
  man="$m-rows8/q30b-4l-$name.manifest.json"
  core="$m-rows8/q30b-4l-$name.core.gguf"
  slots=$(python3 -c "import json; m = json.load(open('$man')); print(len(m['layers']) * m['n_experts'] + 64)")
  for kernels in $passes; do
    export EXPERTD_KERNELS=$kernels
    for pages in huge small; do
      sock="$DIR/$name-$pages.sock"
      "$B/daemon/expertd" --manifest "$man" --socket "$sock" --config /dev/null --cache-slots "$slots" \
        --clients-max 2 --reserve-mib 256 --lock-memory false --log-level error \
        --huge-pages "$([ $pages = huge ] && echo true || echo false)" &
      pids+=($!)
      for _ in $(seq 200); do [ -S "$sock" ] && break; sleep 0.05; done
      "$B/engine/expert-run" bench --model "$core" --socket "$sock" --threads "$(nproc)" -p 512 -n 256 --json >/dev/null
      fill_cache "$sock" "$man"  # every expert in memory: the timed runs read nothing
      hb=$("$B/client/expertctl" --socket "$sock" stats --json | python3 -c 'import json, sys; print(json.load(sys.stdin)["arena_huge_bytes"] / 2**20)')
      echo "  $name $kernels --huge-pages $([ $pages = huge ] && echo true || echo false): ${hb} MiB of the arena in 2 MiB pages"
    done
    : > "$DIR/pages-runs"
    for r in $(seq "$ROUNDS"); do
      order=(local huge small)
      for i in $(seq 0 2); do  # the order turns each round: no run always follows the same one
        what=${order[$(((i + r) % 3))]}
        if [ "$what" = local ]; then
          j=$("$B/engine/expert-run" bench --model "$m.gguf" --local --threads "$(nproc)" -p 256 -n 64 --json)
        else
          j=$("$B/engine/expert-run" bench --model "$core" --socket "$DIR/$name-$what.sock" --threads "$(nproc)" -p 256 -n 64 --json)
        fi
        echo "$r $what $(decode <<<"$j")" >> "$DIR/pages-runs"
      done
    done
    cleanup
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    pids=()
    med() { awk -v w="$1" '$2 == w {print $3}' "$DIR/pages-runs" | median; }
    ratio() { awk -v w="$1" '{v[$1" "$2]=$3} END {for (k in v) {split(k, a, " "); if (a[2] == w) print v[k] / v[a[1]" local"]}}' "$DIR/pages-runs" | median; }
    printf '%-6s %-6s decode tok/s: --local %.1f, expertd 2 MiB pages %.1f (%.2fx), 4 KiB pages %.1f (%.2fx)  [%s rounds, shmem_enabled %s, %s]\n' \
      "$name" "$kernels" "$(med local)" "$(med huge)" "$(ratio huge)" "$(med small)" "$(ratio small)" "$ROUNDS" "$policy" "$cpu"
  done
done
