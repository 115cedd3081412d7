// Small helpers of the x86 SIMD kernels (AVX2 and AVX-512 files; their flags enable AVX2).
#pragma once

#include <immintrin.h>

namespace kernels::x86 {

inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

}  // namespace kernels::x86
