#!/usr/bin/env bash
# The GPU check: on a machine with an NVIDIA GPU, from a fresh clone, in a few minutes:
#   1. installs what is missing (scripts/install-deps.sh; offline, GPU_CARRY=DIR: the .deb files
#      and golden subset that scripts/gpu-carry.sh prepared; the debs are unpacked into .deps-root/),
#   2. builds with the CUDA tier (build-gpu/),
#   3. runs the `gpu` tests: the IPC arena shared by two engine processes, event ordering under a
#      flood of misses, every CUDA kernel against the CPU reference (none may be skipped: a GPU
#      is present),
#   4. benchmarks: H2D bandwidth of the staging path vs bare cudaMemcpyAsync from pinned memory,
#      miss delivery into VRAM vs the drive's O_DIRECT bandwidth, and (when the engine has a
#      --device cuda path) decode tokens/s of a synthetic model with a cache smaller than it.
# Exits non-zero on any failure. GPU_CHECK_OUT=DIR keeps the logs there.
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

step "build (CUDA tier)"
BUILD=build-gpu
# Golden data required: a GPU test that cannot find it fails instead of skipping.
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DEXPERTD_CUDA=ON -DEXPERTD_REQUIRE_GOLDEN=ON -DEXPERTD_WERROR=OFF \
  -DEXPERTD_GOLDEN_DIR="$golden" >"$out/configure.log" 2>&1 ||
  { cat "$out/configure.log"; exit 1; }
cmake --build "$BUILD" -j"$(nproc)" >"$out/build.log" 2>&1 || { tail -50 "$out/build.log"; exit 1; }

step "gpu tests"
set +e
ctest --test-dir "$BUILD" -L gpu --output-on-failure -j4 2>&1 | tee "$out/gpu-tests.log"
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" -ne 0 ]; then echo "gpu tests failed"; exit 1; fi
if grep -q "(Skipped)" "$out/gpu-tests.log"; then
  echo "gpu tests were skipped: they found no usable CUDA device"
  exit 1
fi

step "benchmark: staging path vs bare pinned copies"
"$BUILD"/bench/expert-bench h2d --seconds 2 | tee "$out/h2d.log"

step "benchmark: misses delivered into VRAM vs the drive"
work=${GPU_CHECK_WORK:-/tmp/expertd-gpu-work}
mkdir -p "$work"
[ -f "$work/q30b.manifest.json" ] || {
  "$BUILD"/pack/expert-pack -q synth --preset qwen3-30b-a3b --layers 4 --type Q4_K --out "$work/q30b.gguf"
  "$BUILD"/pack/expert-pack -q build "$work/q30b.gguf" >/dev/null
}
"$BUILD"/bench/expert-bench io --manifest "$work/q30b.manifest.json" --backend cuda --seconds 5 | tee "$out/io-cuda.log"

if "$BUILD"/engine/expert-run bench --help 2>&1 | grep -q -- "--device"; then
  step "benchmark: decode through a cuda expertd, cache a third of the experts"
  rm -f "$work/s.sock"
  "$BUILD"/daemon/expertd --manifest "$work/q30b.manifest.json" --socket "$work/s.sock" --config /dev/null \
    --backend cuda --cache-mib 440 --reserve-mib 1024 --lock-memory false --log-level warn &
  dpid=$!
  trap 'kill $dpid 2>/dev/null || true' EXIT
  for _ in $(seq 300); do [ -S "$work/s.sock" ] && break; sleep 0.1; done
  "$BUILD"/engine/expert-run bench --model "$work/q30b.core.gguf" --socket "$work/s.sock" --device cuda -p 32 -n 64 |
    tee "$out/decode-cuda.log"
  kill "$dpid"
else
  echo "(expert-run has no --device cuda yet: decode benchmark not run)"
fi
step "gpu check passed"
