#!/usr/bin/env bash
# libexpertclient.so as another engine meets it: `cmake --install` into a prefix; its soname and
# exports (the C API only); a C consumer built against it with pkg-config and with
# find_package(expertclient CONFIG), each run against a real expertd serving the bundled model's
# pack, acquiring an expert and checking its bytes against the pack file.
# usage: install_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
B=$(realpath "$1")
S=$(realpath "$2")
tmp=$(mktemp -d "$B/install-test-XXXXXX")
pid=""
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
prefix=$tmp/prefix
cmake --install "$B" --prefix "$prefix" >"$tmp/install.log"
lib=$(find "$prefix" -name 'libexpertclient.so.*.*.*' | head -1)
[ -n "$lib" ] || fail "no libexpertclient.so.X.Y.Z installed"
soname=$(objdump -p "$lib" | awk '/SONAME/ {print $2}')
[[ "$soname" == libexpertclient.so.[0-9]* ]] || fail "soname '$soname'"
[ -e "$(dirname "$lib")/$soname" ] && [ -e "$(dirname "$lib")/libexpertclient.so" ] ||
  fail "the soname and development links are not installed"
others=$(nm -D --defined-only "$lib" | awk '{print $3}' | grep -v '^expertd_' | grep -v '^EXPERTCLIENT_' || true)
[ -z "$others" ] || fail "exports beyond the C API: $(echo $others | head -c 300)"
echo "ok: $(basename "$lib"), soname $soname, exports $(nm -D --defined-only "$lib" | grep -c ' expertd_') expertd_* functions only"

pcdir=$(dirname "$(find "$prefix" -name expertclient.pc | head -1)")
flags=$(PKG_CONFIG_PATH=$pcdir pkg-config --cflags --libs expertclient) || fail "pkg-config"
cc -std=c11 -Wall -Wextra -Werror "$S/tests/client/consumer/consumer.c" $flags -o "$tmp/consumer-pc"
cmake -S "$S/tests/client/consumer" -B "$tmp/cmake" -DCMAKE_PREFIX_PATH="$prefix" >"$tmp/cmake.log" ||
  { cat "$tmp/cmake.log"; fail "find_package(expertclient CONFIG)"; }
cmake --build "$tmp/cmake" >>"$tmp/cmake.log" || { cat "$tmp/cmake.log"; fail "the CMake consumer"; }
echo "ok: the consumer builds with pkg-config ($flags) and with find_package"

cp "$S/model/kjv-moe-q8_0.gguf" "$tmp/kjv.gguf"
"$prefix/bin/expert-pack" -q build "$tmp/kjv.gguf" >"$tmp/pack.log"
sock=$tmp/expertd.sock
"$prefix/bin/expertd" --manifest "$tmp/kjv.manifest.json" --socket "$sock" --config /dev/null \
  --cache-slots 16 --clients-max 2 --reserve-mib 64 --lock-memory false --log-level warn &
pid=$!
for _ in $(seq 200); do [ -S "$sock" ] && break; sleep 0.05; done
[ -S "$sock" ] || fail "expertd did not start"
# Layer 2, expert 17: its block in the pack, from the manifest.
read -r off bytes < <(python3 -c "
import json, sys
L = json.load(open(sys.argv[1]))['layers'][2]
print(L['base'] + 17 * L['stride'], max(r['offset'] + r['bytes'] for r in L['roles']))" "$tmp/kjv.manifest.json")
for c in "$tmp/consumer-pc" "$tmp/cmake/consumer"; do
  out=$(LD_LIBRARY_PATH=$(dirname "$lib") "$c" "$sock" "$tmp/kjv.expertpack" 2 17 "$off" "$bytes") ||
    fail "$(basename "$c"): $out"
  echo "ok: $(basename "$(dirname "$c")")/$(basename "$c"): $out"
done
echo "all passed"
