#!/usr/bin/env bash
# What a packager or a new user types: a plain Release build with the compiler's default flags
# (no -Werror, no project settings, make instead of Ninja), then the CPU test suites on it. CI runs
# this next to scripts/test.sh's build (Ninja, -Werror, the CUDA tier where nvcc is found).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-release}
# The tests on the CUDA emulation are left out (EXPERTD_CUDA_EMULATION_TESTS=OFF, ~100 s of a
# 2-core build): the run below skips them, and test.sh's build compiles and runs them.
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DEXPERTD_REQUIRE_GOLDEN=${EXPERTD_REQUIRE_GOLDEN:-OFF} \
  -DEXPERTD_CUDA=${EXPERTD_CUDA:-AUTO} -DEXPERTD_CUDA_EMULATION_TESTS=OFF
cmake --build "$BUILD" -j"$(nproc)"
# The end-to-end suites of the Python package and of expert-serve's clients (python.*, serve.*:
# venvs from PyPI, about 5 minutes on 2 cores) run the code the suites above test, through
# processes and venvs: they run once, in scripts/test.sh's build.
ctest --test-dir "$BUILD" -j"$(nproc)" -LE 'gpu|cuda-emu|torch' -E '^(python|serve)[.]' \
  --output-on-failure
