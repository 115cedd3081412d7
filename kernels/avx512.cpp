// The AVX-512 VNNI kernels (F, BW, VL, VNNI; flags in CMakeLists.txt). Each computes one weight
// row against N (1..kMaxTile) token rows: the weights are unpacked once per block and reused for
// every token; per token, a 64-weight step is one maddubs and one vpdpwssd (scale applied in the
// integer sum). Every (row, token) result goes through the same operations whatever N is, so a
// token's numbers do not depend on how many share its tile. Types without a tile here run the
// AVX2 kernels (this CPU has AVX2).
#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <type_traits>

#include "kernels/fp16.h"
#include "kernels/isa.h"
#include "kernels/kernels.h"
#include "kernels/x86.h"

namespace kernels::avx512 {

using x86::hsum;

namespace {

// AVX-512 VNNI bodies. Each computes one weight row against N (1..kMaxTile) token rows: the weights
// are unpacked once per block and reused for every token; per token, a 64-weight step is one
// maddubs and one vpdpwssd (scale applied in the integer sum). Every (row, token) result goes
// through the same operations whatever N is, so a token's numbers do not depend on how many share
// its tile.
inline __m512i two_halves16(int lo, int hi) {  // i16 lanes: 16 x lo, then 16 x hi
  return _mm512_inserti64x4(_mm512_set1_epi16(static_cast<int16_t>(lo)),
                            _mm256_set1_epi16(static_cast<int16_t>(hi)), 1);
}

template <bool kFive, int N>
void tile_k45_avx512(const uint8_t* blocks, size_t stride, const BlockQ8K* const* ys, int64_t n,
                     float* out) {
  __m512 acc[N];
  __m256 accm[N];
  for (int t = 0; t < N; ++t) acc[t] = _mm512_setzero_ps(), accm[t] = _mm256_setzero_ps();
  const __m512i low4 = _mm512_set1_epi8(0xF), one = _mm512_set1_epi8(1);
  const __m512i nib_shift = two_halves16(0, 4);  // low half: low nibbles, high half: high nibbles
  __m512i sel[4];                                // sub-blocks 2k (low half) and 2k+1 (high half)
  for (int k = 0; k < 4; ++k) sel[k] = two_halves16(2 * k, 2 * k + 1);
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const uint8_t* blk = blocks + b * stride;
    uint16_t hd, hm;
    std::memcpy(&hd, blk, 2);
    std::memcpy(&hm, blk + 2, 2);
    const uint8_t* q4 = kFive ? blk + 48 : blk + 16;
    uint8_t sm[16];
    k_scales_mins(blk + 4, sm);
    const __m512i sc16 = _mm512_cvtepu8_epi16(
        _mm256_zextsi128_si256(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sm))));
    const __m128i m8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sm + 8));
    const __m256i mins_dup =
        _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));  // m0 m0 m1 m1 ... m7 m7
    const __m512i hbits =
        kFive
            ? _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16)))
            : _mm512_setzero_si512();
    __m512i isum[N];
    for (int t = 0; t < N; ++t) isum[t] = _mm512_setzero_si512();
    for (int k = 0; k < 4; ++k) {
      const __m512i q =
          _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q4 + 32 * k)));
      __m512i w = _mm512_and_si512(_mm512_srlv_epi16(q, nib_shift), low4);
      if (kFive)
        w = _mm512_or_si512(
            w, _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(hbits, sel[k]), one), 4));
      const __m512i sc = _mm512_permutexvar_epi16(sel[k], sc16);
      for (int t = 0; t < N; ++t)
        isum[t] = _mm512_dpwssd_epi32(
            isum[t], _mm512_maddubs_epi16(w, _mm512_loadu_si512(ys[t][b].qs + 64 * k)), sc);
    }
    const float d = fp16_to_fp32(hd), dmin = fp16_to_fp32(hm);
    for (int t = 0; t < N; ++t) {
      acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(d * ys[t][b].d), _mm512_cvtepi32_ps(isum[t]), acc[t]);
      const __m256i pm = _mm256_madd_epi16(
          mins_dup, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ys[t][b].bsums)));
      accm[t] = _mm256_fmadd_ps(_mm256_set1_ps(dmin * ys[t][b].d), _mm256_cvtepi32_ps(pm), accm[t]);
    }
  }
  for (int t = 0; t < N; ++t) out[t] = _mm512_reduce_add_ps(acc[t]) - hsum(accm[t]);
}

template <int N>
void tile_q6_k_avx512(const BlockQ6K* x, const BlockQ8K* const* ys, int64_t n, float* out) {
  __m512 acc[N];
  for (int t = 0; t < N; ++t) acc[t] = _mm512_setzero_ps();
  const __m512i m4 = _mm512_set1_epi8(0xF), m2 = _mm512_set1_epi8(3);
  const __m512i h01 = two_halves16(0, 2), h23 = two_halves16(4, 6);
  // Scale lanes for 64 weights = four 16-weight groups: 8 i16 lanes per scale.
  __m512i sel[4];
  for (int m = 0; m < 4; ++m) {
    alignas(64) int16_t idx[32];
    for (int i = 0; i < 32; ++i) idx[i] = static_cast<int16_t>(4 * m + i / 8);
    sel[m] = _mm512_load_si512(idx);
  }
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x[b].scales));
    const __m256i sc16_256 = _mm256_cvtepi8_epi16(sc8);
    const __m512i sc16 = _mm512_castsi256_si512(sc16_256);
    __m512i isum[N];
    for (int t = 0; t < N; ++t) isum[t] = _mm512_setzero_si512();
    for (int half = 0; half < 2; ++half) {
      // ql: 64 bytes = [l0 | l1]; qh: 32 bytes serving both.
      const __m512i l = _mm512_loadu_si512(x[b].ql + 64 * half);
      const __m512i h = _mm512_broadcast_i64x4(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qh + 32 * half)));
      const __m512i q01 =
          _mm512_or_si512(_mm512_and_si512(l, m4),
                          _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(h, h01), m2), 4));
      const __m512i q23 =
          _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                          _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(h, h23), m2), 4));
      const __m512i s01 = _mm512_permutexvar_epi16(sel[2 * half], sc16),
                    s23 = _mm512_permutexvar_epi16(sel[2 * half + 1], sc16);
      for (int t = 0; t < N; ++t) {
        const int8_t* q8 = ys[t][b].qs + 128 * half;
        isum[t] =
            _mm512_dpwssd_epi32(isum[t], _mm512_maddubs_epi16(q01, _mm512_loadu_si512(q8)), s01);
        isum[t] = _mm512_dpwssd_epi32(isum[t],
                                      _mm512_maddubs_epi16(q23, _mm512_loadu_si512(q8 + 64)), s23);
      }
    }
    const float d = fp16_to_fp32(x[b].d);
    for (int t = 0; t < N; ++t) {
      // sum (q - 32) * q8 * sc = sum q * q8 * sc - 32 * sum sc * bsum
      const __m256i off = _mm256_madd_epi16(
          sc16_256, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ys[t][b].bsums)));
      const __m512i is =
          _mm512_sub_epi32(isum[t], _mm512_zextsi256_si512(_mm256_slli_epi32(off, 5)));
      acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(d * ys[t][b].d), _mm512_cvtepi32_ps(is), acc[t]);
    }
  }
  for (int t = 0; t < N; ++t) out[t] = _mm512_reduce_add_ps(acc[t]);
}

template <int N>
void tile_q8_0_avx512(const BlockQ8_0* x, const BlockQ8_0* const* ys, int64_t n, float* out) {
  __m256 acc[N];
  for (int t = 0; t < N; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kQK8_0; ++b) {
    const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs));
    const __m256i ax = _mm256_abs_epi8(xq);  // |x| as unsigned, the sign moved onto the activations
    const float dx = fp16_to_fp32(x[b].d);
    for (int t = 0; t < N; ++t) {
      const __m256i sy =
          _mm256_sign_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(ys[t][b].qs)), xq);
      const __m256i dot = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ax, sy);
      acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dx * fp16_to_fp32(ys[t][b].d)),
                               _mm256_cvtepi32_ps(dot), acc[t]);
    }
  }
  for (int t = 0; t < N; ++t) out[t] = hsum(acc[t]);
}

template <int N>
void tile_mxfp4_avx512(const BlockMxfp4* x, const BlockQ8_0* const* ys, int64_t n, float* out) {
  const __m128i table = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kMxfp4Doubled));
  const __m128i m4 = _mm_set1_epi8(0xF);
  __m256 acc[N];
  for (int t = 0; t < N; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kQK8_0; ++b) {
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x[b].qs));
    const __m256i w =
        _mm256_set_m128i(_mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(q, 4), m4)),
                         _mm_shuffle_epi8(table, _mm_and_si128(q, m4)));
    const __m256i aw = _mm256_abs_epi8(w);
    const float e = e8m0_half(x[b].e);
    for (int t = 0; t < N; ++t) {
      const __m256i sy =
          _mm256_sign_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(ys[t][b].qs)), w);
      const __m256i dot = _mm256_dpbusd_epi32(_mm256_setzero_si256(), aw, sy);
      acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(e * fp16_to_fp32(ys[t][b].d)),
                               _mm256_cvtepi32_ps(dot), acc[t]);
    }
  }
  for (int t = 0; t < N; ++t) out[t] = hsum(acc[t]);
}

static_assert(kMaxTile == 4, "x86::with_n instantiates tiles of 1..4 tokens");
using x86::with_n;

}  // namespace

void tile_q8_0(const BlockQ8_0* x, const BlockQ8_0* const* ys, int n_tok, int64_t n, float* out) {
  with_n(n_tok, [&](auto N) { tile_q8_0_avx512<N>(x, ys, n, out); });
}
void tile_mxfp4(const BlockMxfp4* x, const BlockQ8_0* const* ys, int n_tok, int64_t n, float* out) {
  with_n(n_tok, [&](auto N) { tile_mxfp4_avx512<N>(x, ys, n, out); });
}
void tile_q4_k(const BlockQ4K* x, const BlockQ8K* const* ys, int n_tok, int64_t n, float* out) {
  with_n(n_tok, [&](auto N) {
    tile_k45_avx512<false, N>(reinterpret_cast<const uint8_t*>(x), sizeof(BlockQ4K), ys, n, out);
  });
}
void tile_q5_k(const BlockQ5K* x, const BlockQ8K* const* ys, int n_tok, int64_t n, float* out) {
  with_n(n_tok, [&](auto N) {
    tile_k45_avx512<true, N>(reinterpret_cast<const uint8_t*>(x), sizeof(BlockQ5K), ys, n, out);
  });
}
void tile_q6_k(const BlockQ6K* x, const BlockQ8K* const* ys, int n_tok, int64_t n, float* out) {
  with_n(n_tok, [&](auto N) { tile_q6_k_avx512<N>(x, ys, n, out); });
}

// One token: the tile of one (what the AVX-512 build has always computed for a single dot).
float dot_q8_0(const BlockQ8_0* x, const BlockQ8_0* y, int64_t n) {
  float r;
  tile_q8_0_avx512<1>(x, &y, n, &r);
  return r;
}
float dot_mxfp4(const BlockMxfp4* x, const BlockQ8_0* y, int64_t n) {
  float r;
  tile_mxfp4_avx512<1>(x, &y, n, &r);
  return r;
}
float dot_q4_k(const BlockQ4K* x, const BlockQ8K* y, int64_t n) {
  float r;
  tile_k45_avx512<false, 1>(reinterpret_cast<const uint8_t*>(x), sizeof(BlockQ4K), &y, n, &r);
  return r;
}
float dot_q5_k(const BlockQ5K* x, const BlockQ8K* y, int64_t n) {
  float r;
  tile_k45_avx512<true, 1>(reinterpret_cast<const uint8_t*>(x), sizeof(BlockQ5K), &y, n, &r);
  return r;
}
float dot_q6_k(const BlockQ6K* x, const BlockQ8K* y, int64_t n) {
  float r;
  tile_q6_k_avx512<1>(x, &y, n, &r);
  return r;
}

}  // namespace kernels::avx512
