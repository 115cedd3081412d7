// What the AVX2 kernel files (avx2.cpp, avx2_quants.cpp; compiled with -mavx2 -mfma -mf16c)
// share: the rows-kernel convention and two small helpers. Internal to kernels/.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/x86.h"

namespace kernels::avx2 {

using x86::hsum;
using x86::with_n;

// A kernel written as `template <int N> void rows(x, ys, n, out)` (N tokens against one weight
// row): its dot is rows<1>, its tile rows<n_tok>, so a tile's tokens get exactly the dot's bits.
#define EXPERTD_ROWS_KERNEL(name, Block, Act, rows)                                          \
  float dot_##name(const Block* x, const Act* y, int64_t n) {                                \
    float out;                                                                               \
    rows<1>(x, &y, n, &out);                                                                 \
    return out;                                                                              \
  }                                                                                          \
  void tile_##name(const Block* x, const Act* const* ys, int n_tok, int64_t n, float* out) { \
    with_n(n_tok, [&](auto N) { rows<N>(x, ys, n, out); });                                  \
  }

inline __m256i mul_sum_i8(__m256i x, __m256i y) {  // signed x signed, summed in i32 lanes
  return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x)),
                           _mm256_set1_epi16(1));
}
inline __m256i load(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}

}  // namespace kernels::avx2
