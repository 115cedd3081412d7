#!/usr/bin/env bash
# Decode speed of a model twice the size of the memory it may use: expertd + expert-run versus
# llama.cpp streaming the GGUF through mmap (no repacking), each under a cgroup v1 memory limit
# of half the model size for every process of the run (page cache included). Needs root, the
# build, and a Python environment with llama-cpp-python (LLAMA_PY, used for the baseline only).
#   LAYERS=12 DIR=/data bash bench/memlimit.sh                       (Qwen3-30B-A3B, Q4_K)
#   PRESET=kimi-k3 TYPE=Q2_K DOWN_TYPE=Q3_K LAYERS=2 bash bench/memlimit.sh   (Kimi-K3's width)
#   PRESET=deepseek-v4-flash TYPE=Q8_0 EXPERT_TYPE=MXFP4 LAYERS=4 bash bench/memlimit.sh
#                                               (DeepSeek-V4-Flash's width, the seed's MXFP4 experts)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${DIR:-/tmp}/expertd-memlimit
layers=${LAYERS:-12}
preset=${PRESET:-qwen3-30b-a3b}
type=${TYPE:-Q4_K}
down=$([ -n "${DOWN_TYPE:-}" ] && echo "--down-type $DOWN_TYPE" || true)
# EXPERT_TYPE: every routed-expert tensor of this type (the rest TYPE)
experts=$([ -n "${EXPERT_TYPE:-}" ] && echo "--gate-type $EXPERT_TYPE --up-type $EXPERT_TYPE --down-type $EXPERT_TYPE" || true)
m=$preset-$layers-$type${DOWN_TYPE:+-$DOWN_TYPE}${EXPERT_TYPE:+-x$EXPERT_TYPE}  # the model's file name
py=${LLAMA_PY:-python3}
n_gen=${N_GEN:-64}
# Prefetch hints (--prefetch) are off by default; PREFETCH=1 turns them on. Before the daemon's
# hint admission (evict only a colder expert) they cost here (11.5 tok/s with, 16.0 without);
# with it they gain a little (13.6 vs 12.9 in one pair of runs, 84% of hinted loads used).
prefetch=$([ "${PREFETCH:-0}" = 1 ] && echo --prefetch || true)
# TRACE=FILE: expertd records every acquire of the run there (expert-bench policy replays it)
trace=$([ -n "${TRACE:-}" ] && echo "--trace-path $TRACE" || true)
mkdir -p "$dir"
[ -f "$dir/$m.gguf" ] || build/pack/expert-pack -q synth --preset "$preset" --layers "$layers" --type "$type" $down $experts --out "$dir/$m.gguf"
[ -f "$dir/$m.manifest.json" ] || build/pack/expert-pack -q build "$dir/$m.gguf" >/dev/null
size=$(stat -c %s "$dir/$m.gguf")
core=$(stat -c %s "$dir/$m.core.gguf")
limit=$((size / 2))
# The arena gets what the limit leaves after the core GGUF and 384 MiB for everything else.
cache_mib=$(((limit - core) / 1048576 - 384))
cg=/sys/fs/cgroup/memory/expertd-memlimit
cleanup() { [ -n "${dpid:-}" ] && kill -TERM "$dpid" 2>/dev/null; sleep 0.5; rmdir "$cg" 2>/dev/null || true; }
trap cleanup EXIT
mkdir -p "$cg"
echo "$limit" > "$cg/memory.limit_in_bytes"
echo "model $preset $((size >> 20)) MiB ($layers layers, $type${DOWN_TYPE:+ with $DOWN_TYPE down}${EXPERT_TYPE:+ with $EXPERT_TYPE experts}), core $((core >> 20)) MiB; limit $((limit >> 20)) MiB; expertd cache $cache_mib MiB"

# What the drive delivers to O_DIRECT reads of this pack (raw io_uring, queue depth 64), just before.
drive=$(build/bench/expert-bench io --manifest "$dir/$m.manifest.json" --seconds 3 | sed -n 's/^raw io_uring O_DIRECT, qd [0-9]*: \([0-9.]*\) GB\/s.*/\1/p')
sync; echo 3 > /proc/sys/vm/drop_caches
sh -c "echo \$\$ > $cg/cgroup.procs; exec build/daemon/expertd --manifest $dir/$m.manifest.json --socket $dir/s.sock \
  --config /dev/null --cache-mib $cache_mib --reserve-mib 0 --clients-max 1 --lock-memory false --log-level warn $trace" &
dpid=$!
for _ in $(seq 200); do [ -S "$dir/s.sock" ] && break; sleep 0.05; done
ours=$(sh -c "echo \$\$ > $cg/cgroup.procs; exec build/engine/expert-run bench --model $dir/$m.core.gguf --socket $dir/s.sock \
  -p 16 -n $n_gen --threads 2 $prefetch --json")
kill -TERM "$dpid"; wait "$dpid" || true; dpid=""
echo "expertd + expert-run: $ours"
echo "peak memory of the run: $(( $(cat $cg/memory.max_usage_in_bytes) >> 20 )) MiB"

sync; echo 3 > /proc/sys/vm/drop_caches
echo 0 > "$cg/memory.max_usage_in_bytes"
prompt=$(python3 -c "import json,sys; print(','.join(map(str, json.loads(sys.argv[1])['prompt'])))" "$ours")
stream=$(python3 -c "import json,sys; print(','.join(map(str, json.loads(sys.argv[1])['decode_stream'])))" "$ours")
ref=$(sh -c "echo \$\$ > $cg/cgroup.procs; exec $py - $dir/$m.gguf $stream $prompt" <<'PY'
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
echo "llama.cpp (mmap, no repack): $ref"
echo "peak memory of the run: $(( $(cat $cg/memory.max_usage_in_bytes) >> 20 )) MiB"
python3 - "$ours" "$ref" "$drive" <<'PY'
import json, sys
o, r = json.loads(sys.argv[1]), json.loads(sys.argv[2])
drive = float(sys.argv[3]) if sys.argv[3] else 0.0
print(f"decode: expertd {o['decode_tok_s']:.2f} tok/s, llama.cpp {r['decode_tok_s']:.3f} tok/s")
if "decode_hit_rate" in o:
    read_gbs = o['decode_read_bytes_per_token'] * o['decode_tok_s'] / 1e9
    print(f"expertd: hit rate {o['decode_hit_rate']:.3f}, {o['decode_misses_per_token']:.1f} misses/token, "
          f"{o['decode_read_bytes_per_token'] / 2**20:.1f} MiB read/token = {read_gbs:.2f} GB/s"
          + (f" of the drive's {drive:.2f} GB/s (O_DIRECT, qd 64)" if drive else ""))
print(f"ratio={o['decode_tok_s'] / r['decode_tok_s']:.2f}")
PY
