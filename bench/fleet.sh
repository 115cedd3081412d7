#!/usr/bin/env bash
# Several expert-serve workers on one expertd behind the SGLang Model Gateway (smg, sglang-router
# from PyPI, in the venv serve.SGLangGateway makes under the build directory; made here if
# missing), against one worker alone: CONVS conversations of TURNS turns at once (each turn the
# whole history again plus a new question, streamed, MAX_TOKENS each; bench/fleet.py), a new set
# of conversations every run. Per setup, medians over ROUNDS alternating rounds: the aggregate
# decode tok/s, the time to first token of the last turn, and the prefix-hit rate (cached prompt
# tokens / prompt tokens from turn 2). Setups: one worker alone; smg cache_aware over 1, 2 and 3
# workers; smg round_robin over 3. On the bundled model by default (MODEL=path.gguf for another,
# packed here, CHAT_TEMPLATE=file.jinja where it needs one); every worker gets THREADS threads, so on a small machine the workers share the
# cores and the aggregate rate measures the gateway's overhead and the prefix hits more than the
# scaling. Needs the build (expertd, expert-pack, expert-serve).
#   ROUNDS=3 CONVS=6 TURNS=4 MAX_TOKENS=64 THREADS=1 bash bench/fleet.sh
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-3}
convs=${CONVS:-6}
turns=${TURNS:-4}
max_tokens=${MAX_TOKENS:-64}
threads=${THREADS:-1}
parallel=${PARALLEL:-4}
model=${MODEL:-model/kjv-moe-q8_0.gguf}
# The bundled model has no chat template of its own (the serve tests give it Qwen3's).
template=${CHAT_TEMPLATE:-tests/data/templates/Qwen-Qwen3-0.6B.jinja}
build=${BUILD:-build}
venv="$build/gateway-venv-sglang-router0.3.2"
if [ ! -e "$venv/.ready" ]; then
  python3 -m venv "$venv" && "$venv/bin/pip" install -q --disable-pip-version-check sglang-router==0.3.2
  touch "$venv/.ready"
fi
dir=$(mktemp -d "${TMPDIR:-/tmp}/fleet-bench.XXXXXX")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
stem=$(basename "$model" .gguf)
cp "$model" "$dir/$stem.gguf"
"$build/pack/expert-pack" -q build "$dir/$stem.gguf"
: > "$dir/d.conf"
"$build/daemon/expertd" --manifest "$dir/$stem.manifest.json" --socket "$dir/d.sock" --config "$dir/d.conf" \
  --lock-memory false --reserve-mib 64 --log-level warn 2> "$dir/expertd.log" &
pids+=($!)
for _ in $(seq 200); do [ -S "$dir/d.sock" ] && break; sleep 0.05; done
base=$((20000 + RANDOM % 20000))
urls=()
for i in 0 1 2; do
  port=$((base + i))
  "$build/serve/expert-serve" --model "$dir/$stem.core.gguf" --socket "$dir/d.sock" --port "$port" \
    --threads "$threads" --parallel "$parallel" --ctx 4096 --alias kjv \
    --chat-template "$template" 2> "$dir/serve$i.log" &
  pids+=($!)
  urls+=("http://127.0.0.1:$port")
done
for u in "${urls[@]}"; do
  for _ in $(seq 600); do curl -sf "$u/health" >/dev/null 2>&1 && break; sleep 0.1; done
done
gw_port=$((base + 10))
run() {  # run LABEL SEED: one bench/fleet.py run for the setup LABEL
  local label=$1 seed=$2 url n policy gpid=""
  case "$label" in
    alone) url=${urls[0]} ;;
    *)
      n=${label#*-}; n=${n%%-*}; policy=cache_aware; [[ "$label" == *-rr ]] && policy=round_robin
      "$venv/bin/smg" launch --host 127.0.0.1 --port "$gw_port" --worker-urls "${urls[@]:0:$n}" \
        --policy "$policy" --prometheus-host 127.0.0.1 --prometheus-port $((gw_port + 1)) \
        --log-level warn > "$dir/smg.log" 2>&1 &
      gpid=$!
      url="http://127.0.0.1:$gw_port"
      for _ in $(seq 300); do curl -sf "$url/v1/models" 2>/dev/null | grep -q '"kjv"' && break; sleep 0.1; done
      ;;
  esac
  python3 bench/fleet.py "$url" --conversations "$convs" --turns "$turns" --max-tokens "$max_tokens" \
    --words model/kjv-words.txt --seed "$seed" --label "$label" | tee -a "$dir/results.jsonl"
  if [ -n "$gpid" ]; then kill -TERM "$gpid"; wait "$gpid" 2>/dev/null || true; fi
}
setups=(alone smg-1 smg-2 smg-3 smg-3-rr)
for r in $(seq "$rounds"); do
  order=("${setups[@]}")
  if [ $((r % 2)) -eq 0 ]; then order=(); for ((i = ${#setups[@]} - 1; i >= 0; i--)); do order+=("${setups[i]}"); done; fi
  for s in "${order[@]}"; do run "$s" $((r * 100 + RANDOM % 100)); done
done
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
isa=$(grep -qw avx512f /proc/cpuinfo && echo avx512 || (grep -qw avx2 /proc/cpuinfo && echo avx2 || echo other))
python3 - "$dir/results.jsonl" "$cpu" "$isa" "$(nproc)" "$convs" "$turns" "$max_tokens" "$threads" "$rounds" <<'PY'
import json, statistics, sys
path, cpu, isa, nproc, convs, turns, max_tokens, threads, rounds = sys.argv[1:]
rows = [json.loads(l) for l in open(path)]
by = {}
for r in rows:
    by.setdefault(r["label"], []).append(r)
alone = statistics.median(r["decode_tok_s"] for r in by["alone"])
print(f"\n{cpu} ({isa}, {nproc} CPUs); {convs} conversations x {turns} turns at once, {max_tokens} tokens a "
      f"turn, {threads} thread(s) a worker; medians of {rounds} rounds")
print(f"{'setup':<28} {'decode tok/s':>12} {'vs alone':>9} {'TTFT turn ' + turns + ' ms':>16} {'prefix hit':>11}")
names = {"alone": "1 worker, no gateway", "smg-1": "smg cache_aware, 1 worker", "smg-2": "smg cache_aware, 2 workers",
         "smg-3": "smg cache_aware, 3 workers", "smg-3-rr": "smg round_robin, 3 workers"}
for label in ("alone", "smg-1", "smg-2", "smg-3", "smg-3-rr"):
    rs = by.get(label, [])
    if not rs:
        continue
    tok = statistics.median(r["decode_tok_s"] for r in rs)
    ttft = statistics.median(r["ttft_last_ms"] for r in rs)
    hit = statistics.median(r["prefix_hit"] for r in rs)
    print(f"{names[label]:<28} {tok:>12.1f} {tok / alone:>8.2f}x {ttft:>16.1f} {hit:>10.0%}")
PY
