#!/usr/bin/env bash
# Decode through expertd against this machine's bound, measured in the same run (issue 15's
# yardstick): bound = 1 / max(compute s/token, bytes read per token / drive bytes/s), where
#   compute = expert-run bench --local on the full GGUF with every byte in page cache,
#   drive   = raw io_uring O_DIRECT reads of the pack at queue depth 64 (expert-bench io),
#   bytes   = what the expertd run itself read per decoded token,
# and the expertd run is bench/memlimit.sh's: the model twice the size of a cgroup v1 memory
# limit, daemon and engine inside it. ROUNDS alternating rounds (each runs the three in a
# rotated order); medians and the spread. Needs root and the build.
#   bash bench/bound.sh                 (12-layer Qwen3-30B-A3B-shaped Q4_K, as memlimit.sh)
#   PREFETCH=1 bash bench/bound.sh      (expert-run --prefetch: next-layer hints)
#   VS=1 bash bench/bound.sh            (both, alternating in each round: hints off and on)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${DIR:-/tmp}/expertd-memlimit
layers=${LAYERS:-12}
preset=${PRESET:-qwen3-30b-a3b}
type=${TYPE:-Q4_K}
m=$preset-$layers-$type
rounds=${ROUNDS:-3}
n_gen=${N_GEN:-64}
variants=("${PREFETCH:+--prefetch}")
[ "${VS:-0}" = 1 ] && variants=("" "--prefetch")
mkdir -p "$dir"
[ -f "$dir/$m.gguf" ] || build/pack/expert-pack -q synth --preset "$preset" --layers "$layers" --type "$type" --out "$dir/$m.gguf"
[ -f "$dir/$m.manifest.json" ] || build/pack/expert-pack -q build "$dir/$m.gguf" >/dev/null
size=$(stat -c %s "$dir/$m.gguf")
core=$(stat -c %s "$dir/$m.core.gguf")
limit=$((size / 2))
cache_mib=$(((limit - core) / 1048576 - 384))  # as memlimit.sh
cg=/sys/fs/cgroup/memory/expertd-bound
cleanup() { [ -n "${dpid:-}" ] && kill -TERM "$dpid" 2>/dev/null; sleep 0.5; rmdir "$cg" 2>/dev/null || true; }
trap cleanup EXIT
mkdir -p "$cg"
echo "$limit" > "$cg/memory.limit_in_bytes"
echo "model $preset $((size >> 20)) MiB ($layers layers, $type), limit $((limit >> 20)) MiB, expertd cache $cache_mib MiB, $rounds rounds"
out=$(mktemp)

drive() {
  local g
  g=$(build/bench/expert-bench io --manifest "$dir/$m.manifest.json" --seconds 2 --rounds 1 |
    sed -n 's/^raw io_uring O_DIRECT, qd [0-9]*: \([0-9.]*\) GB\/s.*/\1/p')
  echo "{\"round\": $1, \"what\": \"drive\", \"gb_s\": $g}" >> "$out"
}
local_run() {
  cat "$dir/$m.gguf" > /dev/null
  local j
  j=$(build/engine/expert-run bench --model "$dir/$m.gguf" --local -p 16 -n "$n_gen" --threads 2 --json)
  echo "{\"round\": $1, \"what\": \"compute\", \"r\": $j}" >> "$out"
}
daemon_run() {  # $2: extra expert-run flags
  sync; echo 3 > /proc/sys/vm/drop_caches
  rm -f "$dir/b.sock"
  sh -c "echo \$\$ > $cg/cgroup.procs; exec build/daemon/expertd --manifest $dir/$m.manifest.json --socket $dir/b.sock \
    --config /dev/null --cache-mib $cache_mib --reserve-mib 0 --clients-max 1 --lock-memory false --log-level warn" &
  dpid=$!
  for _ in $(seq 200); do [ -S "$dir/b.sock" ] && break; sleep 0.05; done
  local j
  j=$(sh -c "echo \$\$ > $cg/cgroup.procs; exec build/engine/expert-run bench --model $dir/$m.core.gguf --socket $dir/b.sock \
    -p 16 -n $n_gen --threads 2 $2 --json")
  kill -TERM "$dpid"; wait "$dpid" || true; dpid=""
  echo "{\"round\": $1, \"what\": \"daemon${2:+ $2}\", \"r\": $j}" >> "$out"
}

for r in $(seq "$rounds"); do
  steps=(drive local_run daemon)
  for ((k = 0; k < (r - 1) % 3; ++k)); do steps=("${steps[@]:1}" "${steps[0]}"); done  # rotate
  for s in "${steps[@]}"; do
    if [ "$s" = daemon ]; then
      for v in "${variants[@]}"; do daemon_run "$r" "$v"; done
    else
      "$s" "$r"
    fi
  done
  echo "round $r done"
done

python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
rounds = sorted({r["round"] for r in rows})
kinds = sorted({r["what"] for r in rows if r["what"].startswith("daemon")})
def get(rnd, what):
    return next(r for r in rows if r["round"] == rnd and r["what"] == what)
def spread(v):
    return f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})"
drive = [get(r, "drive")["gb_s"] for r in rounds]
comp = [get(r, "compute")["r"]["decode_tok_s"] for r in rounds]
print(f"drive (raw O_DIRECT, qd 64): {spread(drive)} GB/s")
print(f"compute alone (--local, page cache): {spread(comp)} tok/s")
for k in kinds:
    dec, bound, ratio, mib, hit = [], [], [], [], []
    for i, r in enumerate(rounds):
        o = get(r, k)["r"]
        b = 1 / max(1 / comp[i], o["decode_read_bytes_per_token"] / (drive[i] * 1e9))
        dec.append(o["decode_tok_s"]); bound.append(b); ratio.append(o["decode_tok_s"] / b)
        mib.append(o["decode_read_bytes_per_token"] / 2**20); hit.append(o["decode_hit_rate"])
    print(f"{k}: decode {spread(dec)} tok/s, bound {spread(bound)} tok/s, "
          f"decode/bound {spread(ratio)}; {spread(mib)} MiB read/token, hit rate {spread(hit)}")
PY
rm -f "$out"
