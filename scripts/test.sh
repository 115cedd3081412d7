#!/usr/bin/env bash
# Builds expertd and runs the whole test suite (the README's second command).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
source scripts/cuda-env.sh
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-Release} -DEXPERTD_CUDA=${EXPERTD_CUDA:-AUTO} \
  -DEXPERTD_REQUIRE_GOLDEN=${EXPERTD_REQUIRE_GOLDEN:-OFF} -DEXPERTD_WERROR=${EXPERTD_WERROR:-ON}
cmake --build "$BUILD" -j"$(nproc)"
if command -v systemd-analyze >/dev/null 2>&1; then
  # Lint the units. The binaries they name are installed by `cmake --install`, not here: that
  # one complaint is expected; anything else fails the run.
  for unit in expertd expert-serve; do
    lint=$(systemd-analyze verify --man=no systemd/$unit.service 2>&1 | grep -v "/usr/local/bin/$unit is not executable" || true)
    if [ -n "$lint" ]; then echo "systemd-analyze verify: $lint"; exit 1; fi
    echo "systemd-analyze verify: $unit.service ok"
  done
fi
ctest --test-dir "$BUILD" -j"$(nproc)" --output-on-failure
