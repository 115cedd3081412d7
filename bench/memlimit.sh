#!/usr/bin/env bash
# Decode speed of a model twice the size of the memory it may use: expertd + expert-run versus
# llama.cpp streaming the GGUF through mmap (no repacking), each under a cgroup v1 memory limit
# of half the model size for every process of the run (page cache included), in ROUNDS (3)
# alternating rounds (the order of the two sides rotated each round): medians and the spread.
# Needs root, the build, and a Python environment with llama-cpp-python (LLAMA_PY, used for the
# baseline only).
#   LAYERS=12 DIR=/data bash bench/memlimit.sh                       (Qwen3-30B-A3B, Q4_K)
#   PRESET=kimi-k3 TYPE=Q2_K DOWN_TYPE=Q3_K LAYERS=2 bash bench/memlimit.sh   (Kimi-K3's width)
#   PRESET=deepseek-v4-flash TYPE=Q8_0 EXPERT_TYPE=MXFP4 LAYERS=4 bash bench/memlimit.sh
#                                               (DeepSeek-V4-Flash's width, the seed's MXFP4 experts)
set -euo pipefail
cd "$(dirname "$0")/.."
py=${LLAMA_PY:-python3}
n_gen=${N_GEN:-64}
rounds=${ROUNDS:-3}
# Prefetch hints (--prefetch) are off by default; PREFETCH=1 turns them on. Before the daemon's
# hint admission (evict only a colder expert) they cost here (11.5 tok/s with, 16.0 without);
# with it they gain a little (13.6 vs 12.9 in one pair of runs, 84% of hinted loads used).
prefetch=$([ "${PREFETCH:-0}" = 1 ] && echo --prefetch || true)
# TRACE=FILE: expertd records every acquire of the first round there (expert-bench policy replays it)
trace=$([ -n "${TRACE:-}" ] && echo "--trace-path $TRACE" || true)
source bench/memlimit-env.sh
cg=/sys/fs/cgroup/memory/expertd-memlimit
cleanup() { [ -n "${dpid:-}" ] && kill -TERM "$dpid" 2>/dev/null; sleep 0.5; rmdir "$cg" 2>/dev/null || true; }
trap cleanup EXIT
mkdir -p "$cg"
echo "$limit" > "$cg/memory.limit_in_bytes"
echo "$model_line; $rounds rounds"
out=$(mktemp)
peak() { echo $(( $(cat $cg/memory.max_usage_in_bytes) >> 20 )); }

ours() {
  # What the drive delivers to O_DIRECT reads of this pack (raw io_uring, queue depth 64), just before.
  local drive j
  drive=$(build/bench/expert-bench io --manifest "$dir/$m.manifest.json" --seconds 3 --rounds 1 | sed -n 's/^raw io_uring O_DIRECT, qd [0-9]*: \([0-9.]*\) GB\/s.*/\1/p')
  sync; echo 3 > /proc/sys/vm/drop_caches
  echo 0 > "$cg/memory.max_usage_in_bytes"
  rm -f "$dir/s.sock"
  sh -c "echo \$\$ > $cg/cgroup.procs; exec build/daemon/expertd --manifest $dir/$m.manifest.json --socket $dir/s.sock \
    --config /dev/null --cache-mib $cache_mib --reserve-mib 0 --clients-max 1 --lock-memory false --log-level warn $([ "$1" = 1 ] && echo $trace)" &
  dpid=$!
  for _ in $(seq 200); do [ -S "$dir/s.sock" ] && break; sleep 0.05; done
  j=$(sh -c "echo \$\$ > $cg/cgroup.procs; exec build/engine/expert-run bench --model $dir/$m.core.gguf --socket $dir/s.sock \
    -p 16 -n $n_gen --threads 2 $prefetch --json")
  kill -TERM "$dpid"; wait "$dpid" || true; dpid=""
  echo "{\"round\": $1, \"what\": \"ours\", \"drive\": ${drive:-0}, \"peak_mib\": $(peak), \"r\": $j}" >> "$out"
  echo "round $1: expertd + expert-run: $j"
}
ref() {  # the same prompt and decode tokens as the first expertd run
  local first prompt stream j
  first=$(grep '"what": "ours"' "$out" | head -1)
  prompt=$(python3 -c "import json,sys; print(','.join(map(str, json.loads(sys.argv[1])['r']['prompt'])))" "$first")
  stream=$(python3 -c "import json,sys; print(','.join(map(str, json.loads(sys.argv[1])['r']['decode_stream'])))" "$first")
  sync; echo 3 > /proc/sys/vm/drop_caches
  echo 0 > "$cg/memory.max_usage_in_bytes"
  j=$(sh -c "echo \$\$ > $cg/cgroup.procs; exec $py - $dir/$m.gguf $stream $prompt" <<'PY'
import sys, time, json
import llama_cpp, llama_cpp.llama_cpp as C
path, stream, prompt = sys.argv[1], [int(t) for t in sys.argv[2].split(",")], [int(t) for t in sys.argv[3].split(",")]
default_params = C.llama_model_default_params
def no_repack():  # llama.cpp's --no-repack: weights stay in the mmap, nothing copied to anonymous memory
    p = default_params()
    p.use_extra_bufts = False
    return p
C.llama_model_default_params = no_repack
llm = llama_cpp.Llama(model_path=path, n_threads=2, n_threads_batch=2, n_ctx=64, n_batch=16, n_gpu_layers=0, verbose=False, use_mmap=True)
t0 = time.time(); llm.eval(prompt); pp = time.time() - t0
t1 = time.time()
for t in stream: llm.eval([t])
print(json.dumps({"prefill_tok_s": len(prompt) / pp, "decode_tok_s": len(stream) / (time.time() - t1)}))
PY
)
  echo "{\"round\": $1, \"what\": \"ref\", \"peak_mib\": $(peak), \"r\": $j}" >> "$out"
  echo "round $1: llama.cpp (mmap, no repack): $j"
}

ours 1  # the first round starts with expertd: its tokens are the ones both sides replay
ref 1
for r in $(seq 2 "$rounds"); do
  if [ $((r % 2)) = 0 ]; then ref "$r"; ours "$r"; else ours "$r"; ref "$r"; fi
done

python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ours = sorted((r for r in rows if r["what"] == "ours"), key=lambda r: r["round"])
ref = sorted((r for r in rows if r["what"] == "ref"), key=lambda r: r["round"])
def spread(v, f="{:.2f}"):
    return f"{f.format(statistics.median(v))} ({f.format(min(v))}-{f.format(max(v))})"
o = [r["r"]["decode_tok_s"] for r in ours]
l = [r["r"]["decode_tok_s"] for r in ref]
print(f"decode over {len(o)} rounds, median (min-max): expertd {spread(o)} tok/s, "
      f"llama.cpp {spread(l, '{:.3f}')} tok/s")
if "decode_hit_rate" in ours[0]["r"]:
    hit = [r["r"]["decode_hit_rate"] for r in ours]
    mib = [r["r"]["decode_read_bytes_per_token"] / 2**20 for r in ours]
    gbs = [r["r"]["decode_read_bytes_per_token"] * r["r"]["decode_tok_s"] / 1e9 for r in ours]
    drive = [r["drive"] for r in ours]
    print(f"expertd: hit rate {spread(hit, '{:.3f}')}, {spread(mib, '{:.1f}')} MiB read/token = "
          f"{spread(gbs)} GB/s; the drive gave raw O_DIRECT reads (qd 64) {spread(drive)} GB/s")
print(f"peak memory: expertd side {max(r['peak_mib'] for r in ours)} MiB, "
      f"llama.cpp {max(r['peak_mib'] for r in ref)} MiB")
# Ratios within a round (the two sides measured minutes apart), then their median.
ratios = [a / b for a, b in zip(o, l)]
print(f"ratio per round: {' '.join(f'{x:.1f}' for x in ratios)}")
print(f"ratio={statistics.median(ratios):.2f}")
PY
rm -f "$out"
