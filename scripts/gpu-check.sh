#!/usr/bin/env bash
# The GPU check: on a machine with an NVIDIA GPU, from a fresh clone, in a few minutes:
#   1. installs what is missing (scripts/install-deps.sh; offline, GPU_CARRY=DIR: the .deb files
#      and golden subset that scripts/gpu-carry.sh prepared; the debs are unpacked into .deps-root/),
#   2. picks a temporary directory where O_DIRECT works (TMPDIR, /tmp, /var/tmp, .gpu-tmp/),
#      builds with the CUDA tier (build-gpu/; the targets the next steps need),
#   3. runs the `gpu` tests (none may be skipped: a GPU is present): the IPC arena shared by two
#      engine processes, event ordering under a flood of misses, every CUDA kernel against the
#      CPU reference, golden logits and greedy tokens on the GPU, daemon slots bit-identical to
#      uploaded experts, every engine op against the CPU backend (the per-op sweep), the command
#      lines,
#   4. benchmarks: H2D bandwidth of the staging path vs bare cudaMemcpyAsync from pinned memory,
#      miss delivery into VRAM vs the drive's O_DIRECT bandwidth, decode tokens/s of a synthetic
#      Qwen3-30B-A3B-shaped model with every expert in VRAM and through a cuda expertd whose cache
#      holds a third of them, without and with a pinned host tier for the rest.
# After the build a failing step is noted and the rest still runs (a GPU machine is scarce: one
# run should report everything); the check exits non-zero if anything failed. GPU_CHECK_OUT=DIR
# keeps its four logs there (configure, build, gpu-tests, bench). GPU_CHECK_NO_DEVICE_OK=1
# rehearses it on a machine without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${GPU_CHECK_OUT:-/tmp/expertd-gpu-check}
mkdir -p "$out"
t0=$(date +%s)
step() { echo "== $* ($(( $(date +%s) - t0 )) s)"; }

step "device"
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; then
  echo "no NVIDIA GPU visible (nvidia-smi): this check is for a machine with one"
  [ "${GPU_CHECK_NO_DEVICE_OK:-0}" = 1 ] || exit 1  # =1: rehearse the build and test steps anyway
fi

step "dependencies"
source scripts/cuda-env.sh
if ! command -v nvcc >/dev/null 2>&1 && [ -z "${CUDACXX:-}" ]; then echo "no nvcc: install the CUDA toolkit"; exit 1; fi
carry=${GPU_CARRY:-}
golden=${GOLDEN_DIR:-$PWD/../shared/golden}
[ -n "$carry" ] && [ -d "$carry/golden" ] && golden=$(cd "$carry/golden" && pwd)
if [ -n "$carry" ] && [ -d "$carry/debs" ] && ! dpkg-query -W -f='${Status}' libboost1.74-dev 2>/dev/null | grep -q "ok installed"; then
  # Offline machine: unpack the carried packages into a private prefix (never into /). CMake finds
  # them through CMAKE_PREFIX_PATH; the loader (and the linker, for libsystemd's own needs) gets
  # only the shared libraries the system lacks, so no system library is shadowed by an older one.
  root=$PWD/.deps-root
  rm -rf "$root"
  mkdir -p "$root/ld"
  for f in "$carry"/debs/*.deb; do
    if command -v dpkg >/dev/null; then dpkg -x "$f" "$root"
    else ar p "$f" "$(ar t "$f" | grep '^data.tar')" | tar -x -C "$root" -f - ; fi
  done
  known=$(ldconfig -p 2>/dev/null | awk '{print $1}' | sort -u)
  for so in "$root"/usr/lib/x86_64-linux-gnu/*.so.* "$root"/lib/x86_64-linux-gnu/*.so.*; do
    [ -e "$so" ] || continue
    name=$(basename "$so")
    grep -qxF "$name" <<<"$known" || ln -sf "$so" "$root/ld/$name"
  done
  echo "carried libraries the system lacks: $(ls "$root/ld" | tr '\n' ' ')"
  export CMAKE_PREFIX_PATH="$root/usr:${CMAKE_PREFIX_PATH:-}"
  export LD_LIBRARY_PATH="$root/ld${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PATH="$root/usr/bin:$PATH"
else
  bash scripts/install-deps.sh
fi

step "scratch directory"
# expertd reads its pack with O_DIRECT, which tmpfs refuses: the tests' temporary files and the
# benchmark's pack go where an O_DIRECT write works.
direct_ok() {
  mkdir -p "$1" 2>/dev/null || return 1
  local rc=0
  dd if=/dev/zero of="$1/.odirect-probe" bs=4096 count=1 oflag=direct status=none 2>/dev/null || rc=1
  rm -f "$1/.odirect-probe"
  return $rc
}
scratch=""
for d in "${TMPDIR:-}" /tmp /var/tmp "$PWD/.gpu-tmp"; do
  if [ -n "$d" ] && direct_ok "$d"; then scratch=$d; break; fi
done
[ -n "$scratch" ] || { echo "no directory here takes O_DIRECT writes (tmpfs?): expertd needs one"; exit 1; }
export TMPDIR=$scratch
echo "temporary files in $scratch"

step "build (CUDA tier)"
BUILD=build-gpu
# Golden data required: a GPU test that cannot find it fails instead of skipping.
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-Release} -DEXPERTD_CUDA=ON -DEXPERTD_REQUIRE_GOLDEN=ON -DEXPERTD_WERROR=OFF \
  -DEXPERTD_GOLDEN_DIR="$golden" >"$out/configure.log" 2>&1 ||
  { cat "$out/configure.log"; exit 1; }
# What the gpu tests and the benchmarks need, not the CPU suites or the CUDA emulation's builds.
targets="cuda_kernels_test cuda_arena_test cuda_engine_test ops_sweep_test cuda_cli_test gpu_probe expertd expertctl expert-run expert-pack expert-bench"
# shellcheck disable=SC2086
cmake --build "$BUILD" -j"$(nproc)" --target $targets >"$out/build.log" 2>&1 || { tail -50 "$out/build.log"; exit 1; }

# From here on a failure is noted and the check goes on, so that one run on a scarce GPU machine
# reports everything; it exits non-zero at the end.
failed=()
step "gpu tests"
set +e
ctest --test-dir "$BUILD" -L gpu --output-on-failure -j4 2>&1 | tee "$out/gpu-tests.log"
rc=${PIPESTATUS[0]}
set -e
[ "$rc" -eq 0 ] || failed+=("gpu tests")
if grep -q "(Skipped)" "$out/gpu-tests.log"; then
  echo "gpu tests were skipped: they found no usable CUDA device"
  failed+=("gpu tests skipped")
fi

: >"$out/bench.log"
bench() {  # bench NAME COMMAND...: runs it, its output also appended to $out/bench.log
  local name=$1
  shift
  step "benchmark: $name" | tee -a "$out/bench.log"
  set +e
  "$@" 2>&1 | tee -a "$out/bench.log"
  local rc=${PIPESTATUS[0]}
  set -e
  [ "$rc" -eq 0 ] || failed+=("benchmark: $name")
}

bench "staging path vs bare pinned copies" "$BUILD"/bench/expert-bench h2d --seconds 2

work=${GPU_CHECK_WORK:-$TMPDIR/expertd-gpu-work}
mkdir -p "$work"
[ -f "$work/q30b.manifest.json" ] || {
  "$BUILD"/pack/expert-pack -q synth --preset qwen3-30b-a3b --layers 4 --type Q4_K --out "$work/q30b.gguf"
  "$BUILD"/pack/expert-pack -q build "$work/q30b.gguf" >/dev/null
}
bench "misses delivered into VRAM vs the drive" \
  "$BUILD"/bench/expert-bench io --manifest "$work/q30b.manifest.json" --backend cuda --seconds 5

# Decode of the 4-layer Qwen3-30B-A3B-shaped model (1.36 GB of experts): every expert in VRAM
# (--local, uploaded once), then through a cuda expertd whose cache holds a third of them.
bench "decode, every expert uploaded to VRAM" \
  "$BUILD"/engine/expert-run bench --model "$work/q30b.gguf" --local --device cuda -p 32 -n 64
rm -f "$work/s.sock"
"$BUILD"/daemon/expertd --manifest "$work/q30b.manifest.json" --socket "$work/s.sock" --config /dev/null \
  --backend cuda --cache-mib 440 --reserve-mib 1024 --lock-memory false --log-level warn &
dpid=$!
trap 'kill $dpid 2>/dev/null || true' EXIT
for _ in $(seq 300); do [ -S "$work/s.sock" ] || ! kill -0 "$dpid" 2>/dev/null && break; sleep 0.1; done
bench "decode through a cuda expertd, cache a third of the experts" \
  "$BUILD"/engine/expert-run bench --model "$work/q30b.core.gguf" --socket "$work/s.sock" --device cuda -p 32 -n 64
"$BUILD"/client/expertctl --socket "$work/s.sock" stats 2>&1 | tee -a "$out/bench.log" || true
kill "$dpid" 2>/dev/null || true
wait "$dpid" 2>/dev/null || true
# The same third in VRAM with a pinned host tier holding the rest (--host-cache-mib): VRAM misses
# are copied up from host memory (host_hits) instead of read from the drive.
rm -f "$work/s.sock"
"$BUILD"/daemon/expertd --manifest "$work/q30b.manifest.json" --socket "$work/s.sock" --config /dev/null \
  --backend cuda --cache-mib 440 --host-cache-mib 1024 --reserve-mib 1024 --lock-memory false --log-level warn &
dpid=$!
for _ in $(seq 300); do [ -S "$work/s.sock" ] || ! kill -0 "$dpid" 2>/dev/null && break; sleep 0.1; done
bench "decode through a cuda expertd, a third in VRAM and a host tier for the rest" \
  "$BUILD"/engine/expert-run bench --model "$work/q30b.core.gguf" --socket "$work/s.sock" --device cuda -p 32 -n 64
"$BUILD"/client/expertctl --socket "$work/s.sock" stats 2>&1 | tee -a "$out/bench.log" || true
kill "$dpid" 2>/dev/null || true

if ((${#failed[@]})); then
  step "gpu check FAILED"
  printf '  - %s\n' "${failed[@]}"
  exit 1
fi
step "gpu check passed"
