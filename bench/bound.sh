#!/usr/bin/env bash
# Decode through expertd against this machine's bound, measured in the same run (issue 15's
# yardstick): bound = 1 / max(compute s/token, bytes read per token / drive bytes/s), where
#   compute = expert-run bench --local on the full GGUF with every byte in page cache,
#   drive   = raw io_uring O_DIRECT reads of the pack at queue depth 64 (expert-bench io),
#   bytes   = what the expertd run itself read per decoded token,
# and the expertd run is bench/memlimit.sh's: the model twice the size of a cgroup v1 memory
# limit, daemon and engine inside it. Also compute while another process reads the drive flat
# out: on this project's 2-vCPU virtual machine that halves it, so overlap cannot reach the
# bound's max(); that second bound is printed too. ROUNDS alternating rounds (each runs the
# four in a rotated order); medians and the spread. Needs root and the build.
#   bash bench/bound.sh                 (12-layer Qwen3-30B-A3B-shaped Q4_K, as memlimit.sh)
#   VARIANTS='off||;hints|--prefetch|;always|--prefetch|--prefetch-admit always' bash bench/bound.sh
#     (expertd runs compared in each round: label|expert-run flags|expertd flags, ';' between)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-3}
n_gen=${N_GEN:-64}
IFS=';' read -r -a variants <<< "${VARIANTS:-daemon||}"
source bench/memlimit-env.sh  # the model, the limit and the arena: as memlimit.sh
cg=/sys/fs/cgroup/memory/expertd-bound
cleanup() { [ -n "${dpid:-}" ] && kill -TERM "$dpid" 2>/dev/null; sleep 0.5; rmdir "$cg" 2>/dev/null || true; }
trap cleanup EXIT
mkdir -p "$cg"
echo "$limit" > "$cg/memory.limit_in_bytes"
echo "$model_line; $rounds rounds"
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
busy_run() {  # compute while the drive is read flat out (raw O_DIRECT, qd 64) by another process
  cat "$dir/$m.gguf" > /dev/null
  build/bench/expert-bench io --manifest "$dir/$m.manifest.json" --seconds 10 --rounds 1 > /dev/null &
  local io=$! j
  sleep 1
  j=$(build/engine/expert-run bench --model "$dir/$m.gguf" --local -p 16 -n "$n_gen" --threads 2 --json)
  wait "$io"
  echo "{\"round\": $1, \"what\": \"busy\", \"r\": $j}" >> "$out"
}
daemon_run() {  # $2: label|expert-run flags|expertd flags
  local label eflags dflags
  IFS='|' read -r label eflags dflags <<< "$2"
  sync; echo 3 > /proc/sys/vm/drop_caches
  rm -f "$dir/b.sock"
  sh -c "echo \$\$ > $cg/cgroup.procs; exec build/daemon/expertd --manifest $dir/$m.manifest.json --socket $dir/b.sock \
    --config /dev/null --cache-mib $cache_mib --reserve-mib 0 --clients-max 1 --lock-memory false --log-level warn $dflags" &
  dpid=$!
  for _ in $(seq 200); do [ -S "$dir/b.sock" ] && break; sleep 0.05; done
  local j
  j=$(sh -c "echo \$\$ > $cg/cgroup.procs; exec build/engine/expert-run bench --model $dir/$m.core.gguf --socket $dir/b.sock \
    -p 16 -n $n_gen --threads 2 $eflags --json")
  kill -TERM "$dpid"; wait "$dpid" || true; dpid=""
  echo "{\"round\": $1, \"what\": \"expertd $label\", \"r\": $j}" >> "$out"
}

for r in $(seq "$rounds"); do
  steps=(drive local_run busy_run daemon)
  for ((k = 0; k < (r - 1) % 4; ++k)); do steps=("${steps[@]:1}" "${steps[0]}"); done  # rotate
  for s in "${steps[@]}"; do
    if [ "$s" = daemon ]; then
      n=${#variants[@]}
      for ((k = 0; k < n; ++k)); do daemon_run "$r" "${variants[(k + r - 1) % n]}"; done  # rotated too
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
kinds = list(dict.fromkeys(r["what"] for r in rows if r["what"].startswith("expertd")))
def get(rnd, what):
    return next(r for r in rows if r["round"] == rnd and r["what"] == what)
def spread(v):
    return f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})"
drive = [get(r, "drive")["gb_s"] for r in rounds]
comp = [get(r, "compute")["r"]["decode_tok_s"] for r in rounds]
print(f"drive (raw O_DIRECT, qd 64): {spread(drive)} GB/s")
busy = [get(r, "busy")["r"]["decode_tok_s"] for r in rounds]
print(f"compute alone (--local, page cache): {spread(comp)} tok/s")
print(f"compute while another process reads the drive flat out: {spread(busy)} tok/s "
      f"({statistics.median(b / c for b, c in zip(busy, comp)):.2f} of alone: on a virtual machine "
      "reads cost the guest CPU and memory bandwidth)")
for k in kinds:
    dec, bound, ratio, mib, hit = [], [], [], [], []
    for i, r in enumerate(rounds):
        o = get(r, k)["r"]
        b = 1 / max(1 / comp[i], o["decode_read_bytes_per_token"] / (drive[i] * 1e9))
        dec.append(o["decode_tok_s"]); bound.append(b); ratio.append(o["decode_tok_s"] / b)
        mib.append(o["decode_read_bytes_per_token"] / 2**20); hit.append(o["decode_hit_rate"])
    # The same bound with compute as measured beside a busy drive: what overlap can reach here.
    bb = [1 / max(1 / busy[i], get(r, k)["r"]["decode_read_bytes_per_token"] / (drive[i] * 1e9))
          for i, r in enumerate(rounds)]
    print(f"{k}: decode {spread(dec)} tok/s, bound {spread(bound)} tok/s, "
          f"decode/bound {spread(ratio)}; {spread(mib)} MiB read/token, hit rate {spread(hit)}; "
          f"decode / bound with the busy-drive compute "
          f"{spread([d / b for d, b in zip(dec, bb)])}")
PY
rm -f "$out"
