#!/usr/bin/env bash
# Long conversations at the drive's speed: an 8-turn conversation (each turn the whole history
# again plus ~200 new tokens after a first turn of ~600, a short streamed reply; past 2,000
# tokens by the end) replayed on
# expert-serve over expertd, on the model of bench/memlimit.sh under its memory limit (cgroup v1,
# page cache included), with prefix reuse and without it (--prefix-cache-mib 0), in alternating
# rounds (a new conversation each round), medians per turn: time to first token and the ratio.
# Then a resume from the SSD tier: the server restarted (its RAM tier empty, the page cache
# dropped), the last turn sent again, against recomputing it. Needs root and the build.
# LLAMA_PY=python-with-llama-cpp-python[server]: llama.cpp's server with its prompt cache
# (cache=True, RAM) under the same limit, one round.
# KV_TYPE=f16: expert-serve's caches and prefix states in F16 (--kv-type). FIRST_WORDS (180, ~600
# tokens): the first turn's words; an agent's first turn carries its system prompt and tool
# definitions, 2-10k tokens (FIRST_WORDS=600: ~2,000).
#   ROUNDS=3 TURNS=8 bash bench/turns.sh
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-3}
turns=${TURNS:-8}
ctx=${CTX:-4096}
prefix_mib=${PREFIX_MIB:-256}
kv_type=${KV_TYPE:-f32}
first_words=${FIRST_WORDS:-180}
source bench/memlimit-env.sh
# The RAM tier lives inside the limit too: the arena gives it up.
cache_mib=$((cache_mib - prefix_mib))
cg=/sys/fs/cgroup/memory/expertd-turns
pdir="$dir/prefix-tier"
cleanup() {
  [ -n "${spid:-}" ] && kill -TERM "$spid" 2>/dev/null
  [ -n "${dpid:-}" ] && kill -TERM "$dpid" 2>/dev/null
  sleep 1; rmdir "$cg" 2>/dev/null || true
}
trap cleanup EXIT
mkdir -p "$cg"
echo "$limit" > "$cg/memory.limit_in_bytes"
echo "$model_line; prefix RAM tier $prefix_mib MiB (taken from the arena: $cache_mib MiB)"
sync; echo 3 > /proc/sys/vm/drop_caches
rm -f "$dir/t.sock"
: > "$dir/turns-serve.log"
sh -c "echo \$\$ > $cg/cgroup.procs; exec build/daemon/expertd --manifest $dir/$m.manifest.json --socket $dir/t.sock \
  --config /dev/null --cache-mib $cache_mib --reserve-mib 0 --clients-max 4 --lock-memory false --log-level warn" &
dpid=$!
for _ in $(seq 200); do [ -S "$dir/t.sock" ] && break; sleep 0.05; done
port=$((20000 + RANDOM % 20000))
serve() {  # serve MIB: expert-serve with that RAM tier (0: no reuse), the SSD tier with it
  local tier=()
  [ "$1" != 0 ] && tier=(--prefix-cache-dir "$pdir")
  sh -c "echo \$\$ > $cg/cgroup.procs; exec build/serve/expert-serve --model $dir/$m.core.gguf --socket $dir/t.sock \
    --port $port --parallel 1 --ctx $ctx --threads 2 --kv-type $kv_type --prefix-cache-mib $1 ${tier[*]}" 2>> "$dir/turns-serve.log" &
  spid=$!
  for _ in $(seq 600); do curl -sf "localhost:$port/health" >/dev/null 2>&1 && break; sleep 0.1; done
}
unserve() { kill -TERM "$spid"; wait "$spid" || true; spid=""; }
out="$dir/turns-results"
[ "${LLAMA_ONLY:-0}" = 1 ] && rounds=0
[ "$rounds" -gt 0 ] && { rm -rf "$out" "$pdir"; mkdir -p "$out"; }
for r in $(seq "$rounds"); do
  order="reuse recompute"; [ $((r % 2)) -eq 0 ] && order="recompute reuse"
  for side in $order; do
    serve $([ "$side" = reuse ] && echo "$prefix_mib" || echo 0)
    python3 bench/turns.py "http://127.0.0.1:$port" --turns "$turns" --seed "$r" --label "$side" --first-words "$first_words" \
      --save-last "$out/last-$side-$r.txt" | tee "$out/$side-$r.log"
    unserve
  done
  # A resume from the SSD tier: restarted, RAM tier and page cache empty; against recomputing.
  sync; echo 3 > /proc/sys/vm/drop_caches
  serve "$prefix_mib"
  python3 bench/turns.py "http://127.0.0.1:$port" --once "$out/last-reuse-$r.txt" --label disk | tee "$out/disk-$r.log"
  unserve
  serve 0
  python3 bench/turns.py "http://127.0.0.1:$port" --once "$out/last-reuse-$r.txt" --label cold | tee "$out/cold-$r.log"
  unserve
done
[ "$rounds" -gt 0 ] && python3 - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def last_json(path):
    return json.loads(open(path).read().strip().splitlines()[-1])
runs = {s: [last_json(f"{out}/{s}-{r}.log")["rows"] for r in range(1, rounds + 1)] for s in ("reuse", "recompute")}
print(f"time to first token per turn, medians of {rounds} alternating rounds:")
print("turn  prompt  cached  reuse_s  recompute_s  ratio")
for t in range(len(runs["reuse"][0])):
    ru = statistics.median(x[t]["ttft_s"] for x in runs["reuse"])
    rc = statistics.median(x[t]["ttft_s"] for x in runs["recompute"])
    p = runs["reuse"][0][t]["prompt_tokens"]; c = runs["reuse"][0][t]["cached_tokens"]
    print(f"{t + 1:4d}  {p:6d}  {c:6d}  {ru:7.3f}  {rc:11.3f}  {rc / ru:5.1f}x")
d = [last_json(f"{out}/disk-{r}.log") for r in range(1, rounds + 1)]
c = [last_json(f"{out}/cold-{r}.log") for r in range(1, rounds + 1)]
dm, cm = statistics.median(x["ttft_s"] for x in d), statistics.median(x["ttft_s"] for x in c)
print(f"last turn after a restart: from the SSD tier {dm:.3f} s ({d[0]['cached_tokens']} tokens resumed) "
      f"vs recomputed {cm:.3f} s: {cm / dm:.1f}x")
PY
[ "$rounds" -gt 0 ] && du -sh "$pdir" | sed 's/^/SSD tier after the run: /'
grep 'KV cache' "$dir/turns-serve.log" | tail -1 || true
echo "peak memory of the run: $(( $(cat $cg/memory.max_usage_in_bytes) >> 20 )) MiB (limit $((limit >> 20)) MiB)"
[ -n "${LLAMA_PY:-}" ] || exit 0
kill -TERM "$dpid"; wait "$dpid" || true; dpid=""
sync; echo 3 > /proc/sys/vm/drop_caches
port=$((port + 1))
# llama.cpp's server (llama-cpp-python's): its one context keeps the last prompt's KV and reuses
# the longest common prefix of the next; LLAMA_CACHE=1 adds its prompt cache (cache=True: a RAM
# cache of prompt states, as large as our RAM tier). The GGUF through mmap, no repack.
sh -c "echo \$\$ > $cg/cgroup.procs; exec $LLAMA_PY - $dir/$m.gguf $port $ctx $prefix_mib ${LLAMA_CACHE:-0}" > "$dir/llama-turns.log" 2>&1 <<'PY' &
import sys
import llama_cpp.llama_cpp as C
default_params = C.llama_model_default_params
def no_repack():
    p = default_params()
    p.use_extra_bufts = False
    return p
C.llama_model_default_params = no_repack
import uvicorn
from llama_cpp.server.app import create_app
from llama_cpp.server.settings import ModelSettings, ServerSettings
app = create_app(server_settings=ServerSettings(host="127.0.0.1", port=int(sys.argv[2])),
                 model_settings=[ModelSettings(model=sys.argv[1], n_threads=2, n_threads_batch=2,
                                               n_ctx=int(sys.argv[3]), n_batch=512, n_gpu_layers=0,
                                               use_mmap=True, use_mlock=False, cache=sys.argv[5] == "1",
                                               cache_type="ram", cache_size=int(sys.argv[4]) << 20,
                                               verbose=False)])
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
PY
spid=$!
for _ in $(seq 1200); do curl -sf "localhost:$port/v1/models" >/dev/null 2>&1 && break; sleep 0.5; done
echo "llama.cpp's server (llama-cpp-python $($LLAMA_PY -c 'import llama_cpp; print(llama_cpp.__version__)'), prompt cache ${LLAMA_CACHE:-0}, mmap, no repack), one round:"
python3 bench/turns.py "http://127.0.0.1:$port" --turns "$turns" --seed 1 --label llama.cpp | tee "$out/llama.log"
echo "peak memory of the run: $(( $(cat $cg/memory.max_usage_in_bytes) >> 20 )) MiB (limit $((limit >> 20)) MiB)"
