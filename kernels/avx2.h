// What the AVX2 kernel files (avx2.cpp, avx2_quants.cpp; compiled with -mavx2 -mfma -mf16c)
// share: the rows-kernel convention, two small helpers, and the super-block types' arithmetic
// (sb_lanes, sb_rows), which the AVX-512 tiles use too. Internal to kernels/.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/quant_blocks.h"
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

// The arithmetic of the super-block types with matrix-matrix panels (Q2_K-Q6_K, IQ4_XS, the grid
// IQ types), on both instruction sets (gemm_avx2.cpp and gemm_avx512.cpp compute the same
// numbers): super-block b's exact integer sum I (and, for the types with mins, their sum M) goes to
// float lane b % 8 as acc = (acc + (d * dy) * I) - (dmin * dy) * M, eight super-blocks' sums
// reduced together; the row's result is hsum(acc) (times the type's factor). kb < 8: the row's last
// super-blocks, the other lanes kept. `is`, `ms`: the 8 super-blocks' integer sums in 8 lanes each
// (zero past kb); dx, dmx: their d and dmin; dy: the activations' scales (zero past kb).
template <bool kMins>
__attribute__((always_inline)) inline __m256 sb_lanes(__m256 acc, int kb, const __m256i* is,
                                                      const __m256i* ms, __m256 dx, __m256 dmx,
                                                      __m256 dy) {
  __m256 r =
      _mm256_add_ps(acc, _mm256_mul_ps(_mm256_mul_ps(dx, dy), _mm256_cvtepi32_ps(x86::sums8(is))));
  if constexpr (kMins)
    r = _mm256_sub_ps(r, _mm256_mul_ps(_mm256_mul_ps(dmx, dy), _mm256_cvtepi32_ps(x86::sums8(ms))));
  if (kb == 8) return r;
  const __m256 keep = _mm256_castsi256_ps(
      _mm256_cmpgt_epi32(_mm256_set1_epi32(kb), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
  return _mm256_blendv_ps(acc, r, keep);
}
// The activations' scales of super-blocks b0 .. b0 + kb - 1 (lanes past kb zero).
__attribute__((always_inline)) inline __m256 q8k_scales(const BlockQ8K* y, int64_t b0, int kb) {
  auto d = [&](int k) { return k < kb ? y[b0 + k].d : 0.0f; };
  return _mm256_setr_ps(d(0), d(1), d(2), d(3), d(4), d(5), d(6), d(7));
}

// Eight super-blocks from b0 (kFull), or the row's last kb, into acc (sb_rows); dx_of(first, kb):
// the d of the kb blocks from `first` in float lanes (zero past kb).
template <int N, bool kMins, bool kFull, class Body, class Dx>
__attribute__((always_inline)) inline void sb_chunk(const uint8_t* blocks, size_t stride,
                                                    size_t dmin_off, int64_t b0, int kb,
                                                    const BlockQ8K* const* ys, __m256* acc,
                                                    const Body& body, const Dx& dx_of) {
  if constexpr (kFull) kb = 8;
  __m256i is[N][8], ms[N][8];
#pragma GCC unroll 1
  for (int k = 0; k < 8; ++k) {  // not unrolled: a body's integer registers would spill
    __m256i I[N], M[N];
    for (int t = 0; t < N; ++t) I[t] = M[t] = _mm256_setzero_si256();
    if (kFull || k < kb) body(b0 + k, I, M);
    for (int t = 0; t < N; ++t) is[t][k] = I[t], ms[t][k] = M[t];
  }
  const uint8_t* first = blocks + b0 * stride;
  const __m256 dx = dx_of(first, kb);
  const __m256 dmx = kMins ? x86::halves8(first + dmin_off, stride, kb) : dx;
  for (int t = 0; t < N; ++t)
    acc[t] = sb_lanes<kMins>(acc[t], kb, is[t], ms[t], dx, dmx, q8k_scales(ys[t], b0, kb));
}

// A row of a super-block type against N tokens in sb_lanes' arithmetic. body(b, I, M) computes
// super-block b's exact integer sums for each token t < N (I[t]; M[t], the mins' sum, when
// kMins) in 8 lanes each; dx_of(first, kb) gives the super-blocks' d (sb_chunk), their dmin are
// fp16 at dmin_off of each block; the result is post * hsum(acc).
template <int N, bool kMins, class Body, class Dx>
__attribute__((always_inline)) inline void sb_rows_dx(const void* x, size_t stride, size_t dmin_off,
                                                      int64_t n, const BlockQ8K* const* ys,
                                                      float post, float* out, const Body& body,
                                                      const Dx& dx_of) {
  const uint8_t* blocks = static_cast<const uint8_t*>(x);
  __m256 acc[N];
  for (int t = 0; t < N; ++t) acc[t] = _mm256_setzero_ps();
  const int64_t nb = n / kQK_K;
  int64_t b0 = 0;
  for (; b0 + 8 <= nb; b0 += 8)
    sb_chunk<N, kMins, true>(blocks, stride, dmin_off, b0, 8, ys, acc, body, dx_of);
  if (b0 < nb)
    sb_chunk<N, kMins, false>(blocks, stride, dmin_off, b0, int(nb - b0), ys, acc, body, dx_of);
  for (int t = 0; t < N; ++t) out[t] = post * hsum(acc[t]);
}
// The same with each super-block's d an fp16 at d_off.
template <int N, bool kMins, class Body>
__attribute__((always_inline)) inline void sb_rows(const void* x, size_t stride, size_t d_off,
                                                   size_t dmin_off, int64_t n,
                                                   const BlockQ8K* const* ys, float post,
                                                   float* out, const Body& body) {
  sb_rows_dx<N, kMins>(
      x, stride, dmin_off, n, ys, post, out, body,
      [&](const uint8_t* first, int kb) { return x86::halves8(first + d_off, stride, kb); });
}

}  // namespace kernels::avx2
