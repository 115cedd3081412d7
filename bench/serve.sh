#!/usr/bin/env bash
# Serving under a memory limit: expert-serve (continuous batching, --parallel 8) over expertd on
# the model of bench/memlimit.sh (12-layer Qwen3-30B-A3B shape, Q4_K, twice the limit), every
# process of the run in a cgroup v1 limit of half the model size (page cache included). The
# same 8 streaming requests at 1 (one at a time), 4 and 8 concurrent clients, alternating
# rounds, medians: total decode tok/s, time to first token and per token p50/p99, bytes read
# from the pack per generated token (bench/serve_load.py). Needs root and the build.
# LLAMA_PY=python-with-llama-cpp-python[server]: then llama.cpp's server (llama-cpp-python's,
# the GGUF through mmap without repacking or mlock, as memlimit.sh) under the same limit, at 8 concurrent
# clients: LLAMA_ROUNDS rounds (1) of the 8 requests with LLAMA_N_GEN tokens each (8; it decodes
# at ~0.5 tok/s here), next to expert-serve's figures at the same N_GEN.
#   LAYERS=12 DIR=/data bash bench/serve.sh
set -euo pipefail
cd "$(dirname "$0")/.."
n_gen=${N_GEN:-32}
rounds=${ROUNDS:-3}
parallel=${PARALLEL:-8}
# PREFETCH=1: expert-serve --prefetch (next-layer hints for the batch's union)
prefetch=$([ "${PREFETCH:-0}" = 1 ] && echo --prefetch || true)
# The model, the limit and the arena as memlimit.sh (the 384 MiB left beside the arena here also
# hold the server's KV caches: parallel x 256 positions).
source bench/memlimit-env.sh
cg=/sys/fs/cgroup/memory/expertd-serve
cleanup() {
  [ -n "${spid:-}" ] && kill -TERM "$spid" 2>/dev/null
  [ -n "${dpid:-}" ] && kill -TERM "$dpid" 2>/dev/null
  sleep 1; rmdir "$cg" 2>/dev/null || true
}
trap cleanup EXIT
mkdir -p "$cg"
echo "$limit" > "$cg/memory.limit_in_bytes"
echo "$model_line"
sync; echo 3 > /proc/sys/vm/drop_caches
rm -f "$dir/s.sock"
sh -c "echo \$\$ > $cg/cgroup.procs; exec build/daemon/expertd --manifest $dir/$m.manifest.json --socket $dir/s.sock \
  --config /dev/null --cache-mib $cache_mib --reserve-mib 0 --clients-max 4 --lock-memory false --log-level warn" &
dpid=$!
for _ in $(seq 200); do [ -S "$dir/s.sock" ] && break; sleep 0.05; done
port=$((20000 + RANDOM % 20000))
sh -c "echo \$\$ > $cg/cgroup.procs; exec build/serve/expert-serve --model $dir/$m.core.gguf --socket $dir/s.sock \
  --port $port --parallel $parallel --ctx 256 --threads 2 $prefetch" 2> "$dir/serve.log" &
spid=$!
for _ in $(seq 600); do curl -sf "localhost:$port/health" >/dev/null 2>&1 && break; sleep 0.1; done
python3 bench/serve_load.py "http://127.0.0.1:$port" --levels 1,4,8 --requests 8 --n-gen "$n_gen" --rounds "$rounds"
echo "peak memory of the run: $(( $(cat $cg/memory.max_usage_in_bytes) >> 20 )) MiB (limit $((limit >> 20)) MiB)"
[ -n "${LLAMA_PY:-}" ] || exit 0
llama_n_gen=${LLAMA_N_GEN:-8}
echo "expert-serve at $llama_n_gen tokens per request, for the comparison:"
python3 bench/serve_load.py "http://127.0.0.1:$port" --levels 8 --requests 8 --n-gen "$llama_n_gen" --rounds 1
kill -TERM "$spid"; wait "$spid" || true; spid=""
kill -TERM "$dpid"; wait "$dpid" || true; dpid=""
sync; echo 3 > /proc/sys/vm/drop_caches
echo 0 > "$cg/memory.max_usage_in_bytes"
port=$((port + 1))
sh -c "echo \$\$ > $cg/cgroup.procs; exec $LLAMA_PY - $dir/$m.gguf $port" > "$dir/llama-server.log" 2>&1 <<'PY' &
import sys
import llama_cpp.llama_cpp as C
default_params = C.llama_model_default_params
def no_repack():  # llama.cpp's --no-repack: weights stay in the mmap (memlimit.sh does the same)
    p = default_params()
    p.use_extra_bufts = False
    return p
C.llama_model_default_params = no_repack
import uvicorn
from llama_cpp.server.app import create_app
from llama_cpp.server.settings import ModelSettings, ServerSettings
app = create_app(server_settings=ServerSettings(host="127.0.0.1", port=int(sys.argv[2])),
                 model_settings=[ModelSettings(model=sys.argv[1], n_threads=2, n_threads_batch=2,
                                               n_ctx=512, n_batch=64, logits_all=False, n_gpu_layers=0,
                                               use_mmap=True, use_mlock=False, verbose=False)])
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
PY
spid=$!
for _ in $(seq 1200); do curl -sf "localhost:$port/v1/models" >/dev/null 2>&1 && break; sleep 0.5; done
echo "llama.cpp's server (llama-cpp-python $($LLAMA_PY -c 'import llama_cpp; print(llama_cpp.__version__)'), mmap, no repack):"
python3 bench/serve_load.py "http://127.0.0.1:$port" --levels 8 --requests 8 --n-gen "$llama_n_gen" --rounds "${LLAMA_ROUNDS:-1}" --no-metrics
echo "peak memory of the run: $(( $(cat $cg/memory.max_usage_in_bytes) >> 20 )) MiB (limit $((limit >> 20)) MiB)"
