#!/usr/bin/env bash
# Speculative decoding against plain decoding (engine/speculative.h): expert-run generate, greedy,
# N_GEN tokens, ROUNDS alternating rounds (plain, ngram, mtp; the order reversed every other
# round), medians: decode tok/s, the drafts kept, tokens per eval and, through expertd, MiB read
# per generated token. The greedy texts are compared too (they must be the same). Through
# expertd, ngram runs twice: with the draft hints (the default: the drafts' earlier routing hinted
# before each verify eval) and with --no-draft-hints. mtp drafts with the bundled model's trained
# NextN head (model/kjv-moe-mtp-q8_0.gguf: the same trunk, model/README.md), which every run
# then uses.
# Prompts, on the bundled model:
#   text     a KJV passage to continue (the model's own distribution; what repeats is its loops)
#   rewrite  an agent-style copy: a passage, an instruction to write it again with small changes,
#            and its first words again (what prompt lookup is for: the output repeats the input)
# Where: ram (--local), expertd (a real expertd whose cache holds half the experts).
# MEMLIMIT=1 adds bench/memlimit-env.sh's synthetic model (random weights: its acceptance is its
# greedy loops') through expertd under a cgroup v1 memory limit of half its size (needs root).
#   ROUNDS=5 N_GEN=160 DRAFT_MAX=8 THREADS=2 bash bench/speculative.sh
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-5}
n_gen=${N_GEN:-160}
draft_max=${DRAFT_MAX:-8}
threads=${THREADS:-2}
build=${BUILD:-build}
model=model/kjv-moe-q8_0.gguf specs="none ngram"
if [ -f model/kjv-moe-mtp-q8_0.gguf ]; then model=model/kjv-moe-mtp-q8_0.gguf specs="none ngram mtp"; fi
work=$(mktemp -d "${TMPDIR:-/tmp}/spec-bench.XXXXXX")
dpid=""
cleanup() {
  [ -n "$dpid" ] && kill -TERM "$dpid" 2>/dev/null && wait "$dpid" 2>/dev/null || true
  [ -d /sys/fs/cgroup/memory/expertd-spec ] && rmdir /sys/fs/cgroup/memory/expertd-spec 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
out="$work/runs.jsonl"
passage="And God said, Let there be light: and there was light. And God saw the light, that it was good: \
and God divided the light from the darkness. And God called the light Day, and the darkness he called Night. \
And the evening and the morning were the first day."
printf '%s' "$passage And God said," > "$work/text.txt"
printf '%s\n\nWrite the passage above again, word for word, changing only Day to Morning.\n\n%s' \
  "$passage" "${passage:0:80}" > "$work/rewrite.txt"

start_expertd() {  # manifest, cache flags, [cgroup]
  rm -f "$work/s.sock"
  local pre=""
  if [ -n "${3:-}" ]; then pre="echo \$\$ > $3/cgroup.procs; "; fi
  sh -c "${pre}exec $build/daemon/expertd --manifest $1 --socket $work/s.sock --config /dev/null $2 \
    --reserve-mib 0 --clients-max 2 --lock-memory false --log-level warn" &
  dpid=$!
  for _ in $(seq 400); do [ -S "$work/s.sock" ] && break; sleep 0.05; done
}
stop_expertd() { kill -TERM "$dpid"; wait "$dpid" || true; dpid=""; }

one() {  # label prompt-file spec where model-args [cgroup]
  local pre="" err="$work/err.txt" txt="$work/out.txt"
  if [ -n "${6:-}" ]; then pre="echo \$\$ > $6/cgroup.procs; "; fi
  local spec=$3 extra=""
  if [ "$spec" = ngram-nohints ]; then spec=ngram extra=--no-draft-hints; fi
  sh -c "${pre}exec $build/engine/expert-run generate $5 --prompt-file $2 -n $n_gen --temp 0 --threads $threads \
    --speculative $spec --draft-max $draft_max --verbose $extra" > "$txt" 2> "$err"
  python3 - "$1" "$3" "$4" "$err" "$txt" >> "$out" <<'EOF'
import json, re, sys
label, spec, where, err, txt = sys.argv[1:]
e = open(err, errors="replace").read()
m = re.search(r"generated (\d+) tokens in ([\d.]+) s \(([\d.]+) tok/s\)", e)
r = {"label": label, "spec": spec, "where": where, "tok_s": float(m.group(3)), "tokens": int(m.group(1)),
     "decode_s": float(m.group(2)),
     "text": open(txt, errors="replace").read()}
s = re.search(r"speculative \w+: (\d+) evals .*; (\d+) drafted, (\d+) accepted", e)
r["evals"], r["drafted"], r["accepted"] = (int(s.group(1)), int(s.group(2)), int(s.group(3))) if s else (r["tokens"], 0, 0)
d = re.search(r"expertd, generated tokens only: .*?([\d.]+) MiB read, .*?([\d.]+) MiB/token", e)
if d:
    r["mib_per_token"] = float(d.group(2))
print(json.dumps(r))
EOF
}

round_pair() {  # round label prompt where model-args [cgroup]
  local order=($specs)
  if [ "$4" = expertd ]; then order=($specs ngram-nohints); fi
  if [ $(($1 % 2)) = 1 ]; then order=($(printf '%s\n' "${order[@]}" | tac)); fi
  for s in "${order[@]}"; do
    if [ "$4" = expertd ]; then start_expertd "$mdir/$stem.manifest.json" "$cache" "${6:-}"; fi
    one "$2" "$3" "$s" "$4" "$5" "${6:-}"
    if [ "$4" = expertd ]; then stop_expertd; fi
  done
}

stem=$(basename "$model" .gguf) mdir=$work
cp "$model" "$work/$stem.gguf"
"$build/pack/expert-pack" -q build "$work/$stem.gguf" > /dev/null
# The bundled model: 4 MoE layers of 32 experts (and the NextN block's 32); the cache holds half.
cache="--cache-slots 64"
if [ "$model" = model/kjv-moe-mtp-q8_0.gguf ]; then cache="--cache-slots 80"; fi
for r in $(seq "$rounds"); do
  for p in text rewrite; do
    round_pair "$r" "$p" "$work/$p.txt" ram "--model $work/$stem.gguf --local"
    round_pair "$r" "$p" "$work/$p.txt" expertd "--model $work/$stem.core.gguf --socket $work/s.sock"
  done
done
if [ "${MEMLIMIT:-0}" = 1 ]; then
  source bench/memlimit-env.sh  # sets dir (the model's), m, limit, cache_mib, preset
  echo "$model_line"
  cg=/sys/fs/cgroup/memory/expertd-spec
  mkdir -p "$cg" && echo "$limit" > "$cg/memory.limit_in_bytes"
  stem=$m cache="--cache-mib $cache_mib"
  mdir=$dir
  for r in $(seq "$rounds"); do
    sync; echo 3 > /proc/sys/vm/drop_caches
    specs="none ngram" round_pair "$r" "memlimit-$preset" "$work/text.txt" expertd "--model $dir/$m.core.gguf --socket $work/s.sock" "$cg"
  done
fi
isa=$(grep -qm1 avx512_vnni /proc/cpuinfo && echo "AVX-512 VNNI" || echo AVX2)
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) ($isa; EXPERTD_KERNELS=${EXPERTD_KERNELS:-best}); $threads threads; $rounds rounds of $n_gen tokens; draft-max $draft_max"
python3 - "$out" <<'EOF'
import json, statistics as st, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
# Per prompt and place, each draft source against plain decoding's median; an eval's cost with
# drafts against one token's: what a kept draft saves is the rest of an eval.
print("| prompt | where | drafts | tok/s | vs plain | drafts kept | drafts/eval | tokens/eval "
      "| ms/eval | MiB/token | same text |")
print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
keys = []
for r in runs:
    if (r["label"], r["where"]) not in keys:
        keys.append((r["label"], r["where"]))
for label, where in keys:
    rs = [r for r in runs if r["label"] == label and r["where"] == where]
    plain = [r for r in rs if r["spec"] == "none"]
    med = lambda rs, k: st.median(r[k] for r in rs) if rs and all(k in r for r in rs) else float("nan")
    tp = med(plain, "tok_s")
    for spec in dict.fromkeys(r["spec"] for r in rs):
        n = [r for r in rs if r["spec"] == spec]
        kept = sum(r["accepted"] for r in n) / max(1, sum(r["drafted"] for r in n))
        per_eval = sum(r["tokens"] for r in n) / max(1, sum(r["evals"] for r in n))
        drafts_eval = sum(r["drafted"] for r in n) / max(1, sum(r["evals"] for r in n))
        ms = 1000 * st.median(r["decode_s"] / max(1, r["evals"]) for r in n)
        same = all(a["text"] == b["text"] for a in plain for b in n)
        name = {"none": "plain", "ngram-nohints": "ngram, hints off"}.get(spec, spec)
        print(f"| {label} | {where} | {name} | {med(n, 'tok_s'):.1f} | {med(n, 'tok_s') / tp:.2f}x | "
              f"{kept:.0%} | {drafts_eval:.2f} | {per_eval:.2f} | {ms:.2f} | "
              f"{med(n, 'mib_per_token'):.2f} | {'yes' if same else 'NO'} |")
EOF
