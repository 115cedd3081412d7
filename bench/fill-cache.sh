# Sourced by the benchmarks that time decode with every expert in the daemon's memory
# (bench/layout.sh, bench/arena_pages.sh). B: the build directory.
#   fill_cache SOCKET MANIFEST   every expert of the pack read into the cache (expertctl warmup,
#                                layer by layer), returning once the daemon holds them all
#   cache_misses SOCKET          the daemon's miss count: unchanged across the timed runs when
#                                they read nothing
cache_misses() {
  "$B/client/expertctl" --socket "$1" stats --json |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["cache_misses"])'
}
fill_cache() {
  # The daemon acts on a limited number of hints at once (a quarter of its slots) and drops the
  # rest, so the warm-ups are sent again, layer by layer, until every expert is in.
  local sock=$1 man=$2 want used=0
  want=$(python3 -c "import json; m = json.load(open('$man')); print(len(m['layers']) * m['n_experts'])")
  for _ in $(seq 60); do
    python3 - "$man" <<'PY' | while read -r layer list; do
import json, sys
m = json.load(open(sys.argv[1]))
for l in m["layers"]:
    print(l["model_layer"], ",".join(str(e) for e in range(m["n_experts"])))
PY
      "$B/client/expertctl" --socket "$sock" warmup --layer "$layer" --experts "$list" </dev/null >/dev/null
      sleep 0.2
    done
    used=$("$B/client/expertctl" --socket "$sock" stats --json |
      python3 -c 'import json, sys; j = json.load(sys.stdin); print(j["slots_used"] - j["slots_loading"])')
    [ "$used" -ge "$want" ] && return 0
    sleep 0.5
  done
  echo "fill_cache: $sock holds $used of $want experts after 60 rounds of warm-ups" >&2
  return 1
}
