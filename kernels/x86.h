// Small helpers of the x86 SIMD kernels (AVX2 and AVX-512 files; their flags enable AVX2).
#pragma once

#include <immintrin.h>

#include <type_traits>

namespace kernels::x86 {

inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

// Calls f with the tile width n (1..4) as a compile-time constant: the tiles are templates over
// their token count (kernels.h's kMaxTile is 4; 8 spills registers and runs slower).
template <typename F>
void with_n(int n, F&& f) {
  switch (n) {
    case 1:
      return f(std::integral_constant<int, 1>{});
    case 2:
      return f(std::integral_constant<int, 2>{});
    case 3:
      return f(std::integral_constant<int, 3>{});
    default:
      return f(std::integral_constant<int, 4>{});
  }
}

}  // namespace kernels::x86
