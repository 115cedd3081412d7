#!/usr/bin/env bash
# Records expertd traces of speculative generation (--speculative ngram, draft hints on, the
# default) of the bundled model, with the hints marked in the trace, and replays them in the
# policy lab with and without the hints (expert-bench policy: lfru against lfru+hints, Belady).
#   plain    8 KJV openings x 250 tokens, temperature 0.8 (record_trace.sh's prompts and seeds)
#   rewrite  4 agent-style prompts x 250 tokens, greedy: a passage, "write it again with a small
#            change", its first words again (what prompt lookup is for)
# --prefetch is off, so every hint in the traces is a draft hint. The traces go to model/trace/.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-model/kjv-moe-q8_0.gguf}
n=${N_GEN:-250}
work=$(mktemp -d)
pid=""
trap '[ -n "$pid" ] && kill -TERM $pid 2>/dev/null; rm -rf "$work"' EXIT
cp "$model" "$work/m.gguf"
build/pack/expert-pack -q build "$work/m.gguf" >/dev/null
start() {
  rm -f "$work/s.sock"
  build/daemon/expertd --manifest "$work/m.manifest.json" --socket "$work/s.sock" --config /dev/null \
    --cache-slots 64 --clients-max 1 --lock-memory false --log-level warn --trace-path "$1" &
  pid=$!
  for _ in $(seq 100); do [ -S "$work/s.sock" ] && break; sleep 0.05; done
}
stop() { kill -TERM $pid; wait $pid || true; pid=""; }
gen() {  # prompt-file, sampling flags
  build/engine/expert-run generate --model "$work/m.core.gguf" --socket "$work/s.sock" \
    --prompt-file "$1" -n "$n" --ctx $((n + 400)) --threads 2 --speculative ngram --draft-max 8 \
    --verbose $2 2>&1 >/dev/null | grep -E "^(speculative|draft hints)" || true
}
start "$work/plain.bin"
seed=1
for p in "In the beginning God created" "And the LORD spake unto Moses, saying," "Blessed are the poor in spirit:" \
         "And it came to pass, when the king" "The LORD is my shepherd;" "And Jesus answered and said unto them," \
         "Praise ye the LORD." "Now the serpent was more subtil"; do
  printf '%s' "$p" > "$work/p.txt"
  gen "$work/p.txt" "--temp 0.8 --top-k 40 --top-p 0.95 --seed $seed"
  seed=$((seed + 1))
done
stop
start "$work/rewrite.bin"
passages=(
  "And God said, Let there be light: and there was light. And God saw the light, that it was good: and God divided the light from the darkness. And God called the light Day, and the darkness he called Night."
  "The LORD is my shepherd; I shall not want. He maketh me to lie down in green pastures: he leadeth me beside the still waters. He restoreth my soul: he leadeth me in the paths of righteousness for his name's sake."
  "In the beginning was the Word, and the Word was with God, and the Word was God. The same was in the beginning with God. All things were made by him; and without him was not any thing made that was made."
  "Blessed are the poor in spirit: for theirs is the kingdom of heaven. Blessed are they that mourn: for they shall be comforted. Blessed are the meek: for they shall inherit the earth.")
changes=("Day to Morning" "shepherd to keeper" "Word to Light" "meek to humble")
for i in 0 1 2 3; do
  printf '%s\n\nWrite the passage above again, word for word, changing only %s.\n\n%s' \
    "${passages[$i]}" "${changes[$i]}" "${passages[$i]:0:60}" > "$work/p.txt"
  gen "$work/p.txt" "--temp 0"
done
stop
mkdir -p model/trace
for t in plain rewrite; do
  gzip -9 -n -c "$work/$t.bin" > "model/trace/kjv-speculative-$t.trace.gz"
  report=model/trace/kjv-speculative-$t-policy-report.txt
  {
    echo "# Routing of $(basename "$model") under --speculative ngram with draft hints ($t prompts)"
    echo "# recorded by model/record_draft_trace.sh; replay: expert-bench policy --trace <(zcat model/trace/kjv-speculative-$t.trace.gz)"
    build/bench/expert-bench policy --trace "$work/$t.bin" | sed "s|$work/$t.bin|model/trace/kjv-speculative-$t.trace (gunzipped)|"
  } > "$report"
  cat "$report"
done
