#!/usr/bin/env bash
# expert-run --local against llama.cpp (its defaults: weights repacked at load) on the weight types
# the seeds' models ship in, measured in one run: a Qwen3-30B-A3B-shaped synthetic model (4
# layers) in Q4_K, Q2_K with Q3_K down (Kimi-K3's mix), IQ2_XXS, MXFP4 experts with Q8_0 the rest
# (DeepSeek-V4-Flash's), IQ4_XS and Q8_0. For each: decode and prefill of 128 tokens in one pass,
# prefill of 512 in a second; the two engines alternate (bench/compare_llamacpp.py), medians of the
# per-round ratios (>= 1: expert-run is as fast). Run on the AVX2 kernels and, where the CPU has
# AVX-512 VNNI, on the AVX-512 ones; the CPU and the ISA are printed with every figure. Named
# types only: the grid types of the giants' dynamic 1- to 3-bit quants, iq1_s, iq1_m, iq2_xs,
# iq2_s, iq3_xxs, iq3_s (the whole model in the type).
#
#   LLAMA_PY=/tmp/venv/bin/python bash bench/lowbit.sh [build-dir] [rounds] [types...]
#
# LLAMA_PY is a Python with llama-cpp-python (CMAKE_ARGS=-DGGML_NATIVE=ON pip install
# llama-cpp-python==0.3.36 builds llama.cpp for this CPU); llama.cpp is the baseline only. On a
# Xeon with AMX in a VM whose kernel does not grant the AMX tiles, that build's first eval dies
# (a general protection fault in libggml-cpu): build it with -DGGML_NATIVE=OFF, the CPU's ISA
# flags (-DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=ON
# -DGGML_AVX512_VNNI=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=ON) and
# -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF. Models
# go to ${LOWBIT_DIR:-/tmp/lowbit} (1-2 GB each). NO_REPACK=1 compares with llama.cpp's
# --no-repack instead. LLAMA_PY_AVX2: a Python whose llama-cpp-python was built for AVX2 alone
# (CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
# -DGGML_AVX512=OFF"): the AVX2 pass then measures against it — what llama.cpp is on an AVX2-only
# CPU — instead of against the native build's AVX-512 kernels.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
ROUNDS=${2:-3}
shift $(($# < 2 ? $# : 2))
DIR=${LOWBIT_DIR:-/tmp/lowbit}
mkdir -p "$DIR"
declare -A MIX=(
  [q4_k]="--type Q4_K"
  [q2_k]="--type Q2_K --down-type Q3_K"
  [iq2_xxs]="--type IQ2_XXS"
  [mxfp4]="--type Q8_0 --gate-type MXFP4 --up-type MXFP4 --down-type MXFP4"
  [iq4_xs]="--type IQ4_XS"
  [q8_0]="--type Q8_0"
  [iq1_s]="--type IQ1_S"
  [iq1_m]="--type IQ1_M"
  [iq2_xs]="--type IQ2_XS"
  [iq2_s]="--type IQ2_S"
  [iq3_xxs]="--type IQ3_XXS"
  [iq3_s]="--type IQ3_S"
)
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(q4_k q2_k iq2_xxs mxfp4 iq4_xs q8_0)
for name in "${names[@]}"; do
  if [ -z "${MIX[$name]:-}" ]; then
    echo "bench/lowbit.sh: no model mix named '$name' (one of: ${!MIX[*]})" >&2
    exit 2
  fi
done
for name in "${names[@]}"; do
  m="$DIR/qwen3-30b-a3b-4l-$name.gguf"
  [ -f "$m" ] || "$B/pack/expert-pack" synth --preset qwen3-30b-a3b --layers 4 ${MIX[$name]} --out "$m" >/dev/null
done
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
passes=avx2
grep -q avx512_vnni /proc/cpuinfo && passes="avx2 avx512"
passes=${PASSES:-$passes}  # PASSES=avx512: one instruction set only
repack=()
[ "${NO_REPACK:-0}" = 1 ] && repack=(--no-repack)
for kernels in $passes; do
  export EXPERTD_KERNELS=$kernels
  PY=${LLAMA_PY:-python3}
  [ "$kernels" = avx2 ] && [ -n "${LLAMA_PY_AVX2:-}" ] && PY=$LLAMA_PY_AVX2
  llama_isa=$("$PY" -c "import llama_cpp; s = llama_cpp.llama_print_system_info().decode(); print('avx512' if 'AVX512 = 1' in s else 'avx2')")
  for name in "${names[@]}"; do
    m="$DIR/qwen3-30b-a3b-4l-$name.gguf"
    a=$("$PY" bench/compare_llamacpp.py --model "$m" --expert-run "$B/engine/expert-run" \
      --threads "$(nproc)" -p 128 -n 32 "${repack[@]}" --repeat "$ROUNDS")
    b=$("$PY" bench/compare_llamacpp.py --model "$m" --expert-run "$B/engine/expert-run" \
      --threads "$(nproc)" -p 512 -n 0 "${repack[@]}" --repeat "$ROUNDS")
    tg=$(grep '^ratio=' <<<"$a" | cut -d= -f2)
    pp128=$(grep '^prefill ratio' <<<"$a" | awk '{print $3}')
    pp512=$(grep '^prefill ratio' <<<"$b" | awk '{print $3}')
    rates=$(grep '^round' <<<"$a" | tail -1 | sed 's/^round [0-9]*: //')
    printf '%-8s %-6s decode %s  prefill-128 %s  prefill-512 %s  (%s; llama.cpp %s; %s)\n' \
      "$name" "$kernels" "$tg" "$pp128" "$pp512" "$rates" "$llama_isa" "$cpu"
  done
done
