#!/usr/bin/env bash
# Decode speed of the low-bit weight types against llama.cpp, measured in one run: a
# Qwen3-30B-A3B-shaped synthetic model (4 layers) in Q2_K (Q3_K down: Kimi-K3's mix), a
# Q3_K_M-like mix (Q3_K, Q4_K down), IQ2_XXS and IQ4_XS; expert-run --local and llama.cpp on the
# same GGUF with the same threads, alternating rounds (bench/compare_llamacpp.py), medians; on
# the AVX2 kernels and on the best this CPU runs.
#
#   LLAMA_PY=/tmp/venv/bin/python bash bench/lowbit.sh [build-dir] [rounds]
#
# LLAMA_PY is a Python with llama-cpp-python (pip install llama-cpp-python==0.3.36 builds it);
# llama.cpp is the baseline only. Models go to ${LOWBIT_DIR:-/tmp/lowbit} (about 1 GB each).
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
ROUNDS=${2:-3}
PY=${LLAMA_PY:-python3}
DIR=${LOWBIT_DIR:-/tmp/lowbit}
mkdir -p "$DIR"
declare -A MIX=(
  [q2_k]="--type Q2_K --down-type Q3_K"
  [q3_k_m]="--type Q3_K --down-type Q4_K"
  [iq2_xxs]="--type IQ2_XXS"
  [iq4_xs]="--type IQ4_XS"
)
for name in q2_k q3_k_m iq2_xxs iq4_xs; do
  m="$DIR/qwen3-30b-a3b-4l-$name.gguf"
  [ -f "$m" ] || "$B/pack/expert-pack" synth --preset qwen3-30b-a3b --layers 4 ${MIX[$name]} --out "$m"
done
passes=avx2
grep -q avx512_vnni /proc/cpuinfo && passes="avx2 best"  # the best ISA is AVX2 otherwise
for kernels in $passes; do
  for name in q2_k q3_k_m iq2_xxs iq4_xs; do
    m="$DIR/qwen3-30b-a3b-4l-$name.gguf"
    echo "== $name, EXPERTD_KERNELS=${kernels}"
    if [ "$kernels" = avx2 ]; then export EXPERTD_KERNELS=avx2; else unset EXPERTD_KERNELS; fi
    "$PY" bench/compare_llamacpp.py --model "$m" --expert-run "$B/engine/expert-run" --threads "$(nproc)" \
      -p 64 -n 32 --no-repack --repeat "$ROUNDS" | grep -E "^model|ratio"
  done
done
