// The AVX-512 VNNI kernels (F, BW, VL, VNNI; flags in CMakeLists.txt). Each computes one weight
// row against N (1..kMaxTile) token rows: the weights are unpacked once per block and reused for
// every token; per token, a 64-weight step is one maddubs and one vpdpwssd (scale applied in the
// integer sum). Every (row, token) result goes through the same operations whatever N is, so a
// token's numbers do not depend on how many share its tile. The super-block types' sums go
// through avx2.h's sb_rows (each super-block's exact sums into float lane b % 8), so they give
// the AVX2 bodies' bits. Types without a tile here run the AVX2 kernels (this CPU has AVX2).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <type_traits>

#include "kernels/avx2.h"
#include "kernels/dequant.h"
#include "kernels/fp16.h"
#include "kernels/grid_rows512.h"
#include "kernels/iq_grids.h"
#include "kernels/isa.h"
#include "kernels/kernels.h"
#include "kernels/x86.h"

namespace kernels::avx512 {

using x86::hsum;

namespace {

// A super-block's 16 lane sums as 8 (exact: integers), for sb_rows (avx2.h).
inline __m256i fold(__m512i v) {
  return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}
inline __m512i two_halves16(int lo, int hi) {  // i16 lanes: 16 x lo, then 16 x hi
  return _mm512_inserti64x4(_mm512_set1_epi16(static_cast<int16_t>(lo)),
                            _mm256_set1_epi16(static_cast<int16_t>(hi)), 1);
}

template <bool kFive, int N>
void tile_k45_avx512(const uint8_t* blocks, size_t stride, const BlockQ8K* const* ys, int64_t n,
                     float* out) {
  const __m512i low4 = _mm512_set1_epi8(0xF), one = _mm512_set1_epi8(1);
  const __m512i nib_shift = two_halves16(0, 4);  // low half: low nibbles, high half: high nibbles
  __m512i sel[4];                                // sub-blocks 2k (low half) and 2k+1 (high half)
  for (int k = 0; k < 4; ++k) sel[k] = two_halves16(2 * k, 2 * k + 1);
  avx2::sb_rows<N, true>(
      blocks, stride, 0, 2, n, ys, 1.0f, out, [&](int64_t b, __m256i* I, __m256i* M) {
        const uint8_t* blk = blocks + b * stride;
        const uint8_t* q4 = kFive ? blk + 48 : blk + 16;
        uint8_t sm[16];
        k_scales_mins(blk + 4, sm);
        const __m512i sc16 = _mm512_cvtepu8_epi16(
            _mm256_zextsi128_si256(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sm))));
        const __m128i m8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sm + 8));
        const __m256i mins_dup =
            _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));  // m0 m0 m1 m1 ... m7 m7
        const __m512i hbits = kFive ? _mm512_broadcast_i64x4(_mm256_loadu_si256(
                                          reinterpret_cast<const __m256i*>(blk + 16)))
                                    : _mm512_setzero_si512();
        __m512i isum[N];
        for (int t = 0; t < N; ++t) isum[t] = _mm512_setzero_si512();
        for (int k = 0; k < 4; ++k) {
          const __m512i q = _mm512_broadcast_i64x4(
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q4 + 32 * k)));
          __m512i w = _mm512_and_si512(_mm512_srlv_epi16(q, nib_shift), low4);
          if (kFive)
            w = _mm512_or_si512(
                w, _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(hbits, sel[k]), one), 4));
          const __m512i sc = _mm512_permutexvar_epi16(sel[k], sc16);
          for (int t = 0; t < N; ++t)
            isum[t] = _mm512_dpwssd_epi32(
                isum[t], _mm512_maddubs_epi16(w, _mm512_loadu_si512(ys[t][b].qs + 64 * k)), sc);
        }
        for (int t = 0; t < N; ++t) {
          M[t] = _mm256_madd_epi16(
              mins_dup, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ys[t][b].bsums)));
          I[t] = fold(isum[t]);
        }
      });
}

template <int N>
void tile_q6_k_avx512(const BlockQ6K* x, const BlockQ8K* const* ys, int64_t n, float* out) {
  const __m512i m4 = _mm512_set1_epi8(0xF), m2 = _mm512_set1_epi8(3);
  const __m512i h01 = two_halves16(0, 2), h23 = two_halves16(4, 6);
  // Scale lanes for 64 weights = four 16-weight groups: 8 i16 lanes per scale.
  __m512i sel[4];
  for (int m = 0; m < 4; ++m) {
    alignas(64) int16_t idx[32];
    for (int i = 0; i < 32; ++i) idx[i] = static_cast<int16_t>(4 * m + i / 8);
    sel[m] = _mm512_load_si512(idx);
  }
  avx2::sb_rows<N, false>(
      x, sizeof(BlockQ6K), offsetof(BlockQ6K, d), 0, n, ys, 1.0f, out,
      [&](int64_t b, __m256i* I, __m256i*) {
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
          const __m512i q01 = _mm512_or_si512(
              _mm512_and_si512(l, m4),
              _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(h, h01), m2), 4));
          const __m512i q23 = _mm512_or_si512(
              _mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
              _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(h, h23), m2), 4));
          const __m512i s01 = _mm512_permutexvar_epi16(sel[2 * half], sc16),
                        s23 = _mm512_permutexvar_epi16(sel[2 * half + 1], sc16);
          for (int t = 0; t < N; ++t) {
            const int8_t* q8 = ys[t][b].qs + 128 * half;
            isum[t] = _mm512_dpwssd_epi32(isum[t],
                                          _mm512_maddubs_epi16(q01, _mm512_loadu_si512(q8)), s01);
            isum[t] = _mm512_dpwssd_epi32(
                isum[t], _mm512_maddubs_epi16(q23, _mm512_loadu_si512(q8 + 64)), s23);
          }
        }
        for (int t = 0; t < N; ++t) {
          // sum (q - 32) * q8 * sc = sum q * q8 * sc - 32 * sum sc * bsum
          const __m256i off = _mm256_madd_epi16(
              sc16_256, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ys[t][b].bsums)));
          I[t] = _mm256_sub_epi32(fold(isum[t]), _mm256_slli_epi32(off, 5));
        }
      });
}

// One block's 4-element sums: |w| x the activations with w's signs, one vpdpbusd.
struct DotVnni {
  static __m256i dot(__m256i aw, __m256i sy) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), aw, sy);
  }
};

template <int N>
void tile_q8_0_avx512(const BlockQ8_0* x, const BlockQ8_0* const* ys, int64_t n, float* out) {
  x86::tile_b32<DotVnni, x86::Q8_0Values, BlockQ8_0, N>(x, ys, n, out);
}
template <int N>
void tile_mxfp4_avx512(const BlockMxfp4* x, const BlockQ8_0* const* ys, int64_t n, float* out) {
  x86::tile_b32<DotVnni, x86::Mxfp4Values, BlockMxfp4, N>(x, ys, n, out);
}

// Activations x weight signs: q negated where the 64-bit mask has a bit set (AVX-512 has no
// sign_epi8).
inline __m512i negate_where(__m512i q, __mmask64 neg) {
  return _mm512_mask_sub_epi8(q, neg, _mm512_setzero_si512(), q);
}

// Q2_K's and Q3_K's 64-weight steps: the 2-bit fields 2j and 2j + 1 of 32 bytes (shift), and the
// scales of their four 16-weight groups spread over i16 lanes (sel).
struct TwoBitSteps {
  __m512i shift[2], sel[4];
  TwoBitSteps() {
    for (int j = 0; j < 2; ++j) shift[j] = two_halves16(4 * j, 4 * j + 2);
    for (int k = 0; k < 4; ++k) {
      alignas(64) int16_t idx[32];
      for (int i = 0; i < 32; ++i) idx[i] = static_cast<int16_t>(4 * k + i / 8);
      sel[k] = _mm512_load_si512(idx);
    }
  }
};

// Q2_K: 2-bit weights (0..3) x sub-block scales, less dmin x mins against the 16-element sums.
template <int N>
void tile_q2_k_avx512(const BlockQ2K* x, const BlockQ8K* const* ys, int64_t n, float* out) {
  const __m512i m3 = _mm512_set1_epi8(3);
  const __m128i m4 = _mm_set1_epi8(0xF);
  const TwoBitSteps st;
  avx2::sb_rows<N, true>(
      x, sizeof(BlockQ2K), offsetof(BlockQ2K, d), offsetof(BlockQ2K, dmin), n, ys, 1.0f, out,
      [&](int64_t b, __m256i* I, __m256i* M) {
        const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x[b].scales));
        const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc8, 4), m4));
        const __m512i sc16 = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(_mm_and_si128(sc8, m4)));
        __m512i isum[N];
        for (int t = 0; t < N; ++t) isum[t] = _mm512_setzero_si512();
        for (int h = 0; h < 2; ++h) {
          const __m512i q2 = _mm512_broadcast_i64x4(
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs + 32 * h)));
          for (int j = 0; j < 2; ++j) {  // sub-blocks 4h + 2j and 4h + 2j + 1: 64 weights
            const __m512i q = _mm512_and_si512(_mm512_srlv_epi16(q2, st.shift[j]), m3);
            const __m512i sc = _mm512_permutexvar_epi16(st.sel[2 * h + j], sc16);
            for (int t = 0; t < N; ++t)
              isum[t] = _mm512_dpwssd_epi32(
                  isum[t],
                  _mm512_maddubs_epi16(q, _mm512_loadu_si512(ys[t][b].qs + 128 * h + 64 * j)), sc);
          }
        }
        for (int t = 0; t < N; ++t) {
          M[t] = _mm256_madd_epi16(
              mins, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ys[t][b].bsums)));
          I[t] = fold(isum[t]);
        }
      });
}

// Q3_K: u = q | high bit << 2 in 0..7 against the activations, less 4 x their 16-element sums.
template <int N>
void tile_q3_k_avx512(const BlockQ3K* x, const BlockQ8K* const* ys, int64_t n, float* out) {
  const __m512i m3 = _mm512_set1_epi8(3), one = _mm512_set1_epi8(1);
  const TwoBitSteps st;
  avx2::sb_rows<N, false>(
      x, sizeof(BlockQ3K), offsetof(BlockQ3K, d), 0, n, ys, 1.0f, out,
      [&](int64_t b, __m256i* I, __m256i*) {
        const __m128i s8 = x86::q3k_scales(x[b].scales);
        const __m256i s16 = _mm256_cvtepi8_epi16(s8);
        const __m512i sc16 = _mm512_castsi256_si512(s16);
        const __m512i hm = _mm512_broadcast_i64x4(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].hmask)));
        __m512i isum[N];
        for (int t = 0; t < N; ++t) isum[t] = _mm512_setzero_si512();
        for (int h = 0; h < 2; ++h) {
          const __m512i q3 = _mm512_broadcast_i64x4(
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs + 32 * h)));
          for (int j = 0; j < 2; ++j) {
            const int k = 4 * h + 2 * j;  // sub-blocks k, k + 1 (32 weights each)
            const __m512i q = _mm512_and_si512(_mm512_srlv_epi16(q3, st.shift[j]), m3);
            const __m512i hb = _mm512_and_si512(_mm512_srlv_epi16(hm, two_halves16(k, k + 1)), one);
            const __m512i u = _mm512_or_si512(q, _mm512_slli_epi16(hb, 2));
            const __m512i sc = _mm512_permutexvar_epi16(st.sel[2 * h + j], sc16);
            for (int t = 0; t < N; ++t)
              isum[t] = _mm512_dpwssd_epi32(
                  isum[t], _mm512_maddubs_epi16(u, _mm512_loadu_si512(ys[t][b].qs + 32 * k)), sc);
          }
        }
        for (int t = 0; t < N; ++t) {
          const __m256i off = _mm256_madd_epi16(
              s16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ys[t][b].bsums)));
          I[t] = _mm256_sub_epi32(fold(isum[t]), _mm256_slli_epi32(off, 2));
        }
      });
}

// A grid group's 32 magnitudes g against each token's activations given the weights' signs (the
// mask m: the activations negated where set; Q8_K's are within +-127), times the i16 scales ls,
// into the tokens' super-block sums: the AVX2 bodies' exact integer sums.
template <int N>
__attribute__((always_inline)) inline void signed_group(__m256i* isum, const BlockQ8K* const* ys,
                                                        int64_t b, int ib, __m256i g, __mmask32 m,
                                                        __m256i ls) {
  for (int t = 0; t < N; ++t) {
    const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ys[t][b].qs + 32 * ib));
    const __m256i q8 = _mm256_mask_sub_epi8(y, m, _mm256_setzero_si256(), y);
    isum[t] = _mm256_dpwssd_epi32(isum[t], _mm256_maddubs_epi16(g, q8), ls);
  }
}

// IQ2_XXS: per 32 weights four 8-weight grid rows (unsigned), four 7-bit sign indices and a 4-bit
// scale; the signs become a mask put onto the activations (a sign index is the low 7 bits of its
// 8 signs, the eighth their parity: ksigns_iq2xs, the block's 32 decoded at once: 7.6 -> 8.2
// GB/s on an Intel Xeon, expert-bench gemv; the AVX2 body's table of +1/-1 bytes stays faster
// there than expanding the bits). 32 weights a step: a gather of 4 or 8 grid rows runs slower
// here than 4 loads.
template <int N>
void tile_iq2_xxs_avx512(const BlockIq2Xxs* x, const BlockQ8K* const* ys, int64_t n, float* out) {
  avx2::sb_rows<N, false>(x, sizeof(BlockIq2Xxs), 0, 0, n, ys, 0.125f, out,
                          [&](int64_t b, __m256i* isum, __m256i*) {
                            const uint8_t* q = reinterpret_cast<const uint8_t*>(x[b].qs);
                            alignas(32) uint8_t signs[32];
                            x86::iq2xxs_block_signs(q, signs);
                            for (int ib = 0; ib < 8; ++ib, q += 8) {
                              uint32_t aux, neg;
                              std::memcpy(&aux, q + 4, 4);
                              std::memcpy(&neg, signs + 4 * ib, 4);
                              const __m256i g = x86::iq2xxs_grid(q);
                              const __mmask32 m = _cvtu32_mask32(neg);
                              const __m256i ls = _mm256_set1_epi16(int16_t(2 * (aux >> 28) + 1));
                              signed_group<N>(isum, ys, b, ib, g, m, ls);
                            }
                          });
}

// IQ3_XXS: per 32 weights eight 4-weight grid rows (unsigned, <= 62; iq_grids.h's iq3xxs_rows8:
// gathered unless gathers are slow), the signs (the block's eight aux dwords decoded at once,
// x86::aux_signs) a mask put onto the activations, as IQ2_XXS's: the AVX2 tile's exact sums, so
// its bits.
template <int N, bool kGather>
void tile_iq3_xxs_plain_avx512(const BlockIq3Xxs* x, const BlockQ8K* const* ys, int64_t n,
                               float* out) {
  avx2::sb_rows<N, false>(
      x, sizeof(BlockIq3Xxs), 0, 0, n, ys, 0.25f, out, [&](int64_t b, __m256i* isum, __m256i*) {
        const uint8_t* q = x[b].qs;
        alignas(32) uint8_t signs[32];
        x86::aux_signs(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 64)), signs);
        for (int ib = 0; ib < 8; ++ib) {
          uint32_t aux, neg;
          std::memcpy(&aux, q + 64 + 4 * ib, 4);
          std::memcpy(&neg, signs + 4 * ib, 4);
          const __m256i g = iq3xxs_rows8<kGather>(q + 8 * ib);
          const __mmask32 m = _cvtu32_mask32(neg);
          const __m256i ls = _mm256_set1_epi16(int16_t(2 * (aux >> 28) + 1));
          signed_group<N>(isum, ys, b, ib, g, m, ls);
        }
      });
}

// IQ3_S: as IQ3_XXS, the grid's 512 rows indexed by a byte and a bit of qh, the signs plain bits
// (the mask itself), one scale per 32.
template <int N, bool kGather>
void tile_iq3_s_plain_avx512(const BlockIq3S* x, const BlockQ8K* const* ys, int64_t n, float* out) {
  avx2::sb_rows<N, false>(x, sizeof(BlockIq3S), 0, 0, n, ys, 1.0f, out,
                          [&](int64_t b, __m256i* isum, __m256i*) {
                            for (int ib = 0; ib < 8; ++ib) {
                              const __m256i g = iq3s_rows8<kGather>(x[b].qs + 8 * ib, x[b].qh[ib]);
                              uint32_t neg;
                              std::memcpy(&neg, x[b].signs + 4 * ib, 4);
                              const __mmask32 m = _cvtu32_mask32(neg);
                              const int l = x[b].scales[ib / 2] >> (4 * (ib % 2)) & 0xf;
                              const __m256i ls = _mm256_set1_epi16(int16_t(2 * l + 1));
                              signed_group<N>(isum, ys, b, ib, g, m, ls);
                            }
                          });
}

// IQ1_S and IQ1_M (iq_grids.h; the AVX2 tiles' arithmetic, avx2_quants.cpp): u, 8 x (grid + 1)
// plus the delta's share (IQ1_M) or 8 x (grid + 1) alone (IQ1_S, whose delta goes with the bias
// into the offsets of the activations' 16-element sums), against the activations by vpdpbusd
// (four products a lane, <= 4 x 18 x 127: the lane fits 16 bits), times the scales by vpdpwssd
// on the lane's low word: the same exact integer sums, so the AVX2 tiles' bits.
template <int N, class Block, class Group>
__attribute__((always_inline)) inline void iq1_avx512(const Block* x, const BlockQ8K* const* ys,
                                                      int64_t n, float* out, const Group& group) {
  const uint64_t* grid8 = iq1_grid8();
  avx2::sb_rows_dx<N, false>(
      x, sizeof(Block), 0, n, ys, 0.125f, out,
      [&](int64_t b, __m256i* I, __m256i*) {
        alignas(32) int16_t off[16];  // each 16 elements' activation sum's factor
#pragma GCC unroll 8
        for (int ib = 0; ib < 8; ++ib) {
          int s0, s1;
          const __m256i u = group(x[b], ib, grid8, s0, s1, off + 2 * ib);
          const __m256i scale =  // i32 lanes: the scale in the low word
              Iq1<Block>::kSub == 32 ? _mm256_set1_epi32(s0)
                                     : _mm256_setr_m128i(_mm_set1_epi32(s0), _mm_set1_epi32(s1));
          for (int t = 0; t < N; ++t)
            I[t] = _mm256_dpwssd_epi32(
                I[t],
                _mm256_dpbusd_epi32(
                    _mm256_setzero_si256(), u,
                    _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ys[t][b].qs + 32 * ib))),
                scale);
        }
        const __m256i o16 = _mm256_load_si256(reinterpret_cast<const __m256i*>(off));
        for (int t = 0; t < N; ++t)
          I[t] = _mm256_add_epi32(
              I[t], _mm256_madd_epi16(
                        o16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ys[t][b].bsums))));
      },
      iq1_d8<Block>);
}

// IQ1_S and IQ1_M where gathers are fast: 64 weights a step, the eight rows' 11-bit indices made
// in a register (the low bytes zero-extended, the high bits rotated into place from the group
// pair's qh) and their iq1_grid8 rows gathered at once; the super-block's sixteen 16-element
// scales and the offsets of its 16-element sums made once, a step's scales picked by vpermd. Then
// iq1_avx512's vpdpbusd and vpdpwssd per token, 64 weights at a time: the same exact sums.
// rows(b, m): super-block b's u for rows 8m .. 8m + 7; scales(b, o16): its 16 scales s (2 s + 1
// from the 3-bit field) as i16, and its 16 offsets, an i16 pair each, into o16.
template <int N, class Block, class Rows, class Scales>
__attribute__((always_inline)) inline void iq1_gather(const Block* x, const BlockQ8K* const* ys,
                                                      int64_t n, float* out, const Rows& rows,
                                                      const Scales& scales) {
  const __m512i quarter = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  avx2::sb_rows_dx<N, false>(
      x, sizeof(Block), 0, n, ys, 0.125f, out,
      [&](int64_t b, __m256i* I, __m256i*) {
        __m256i o16;
        const __m512i s16 = _mm512_cvtepu16_epi32(scales(x[b], o16));  // the scale in the low word
        __m512i acc[N];
        for (int t = 0; t < N; ++t) {
          I[t] = _mm256_madd_epi16(
              o16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ys[t][b].bsums)));
          acc[t] = _mm512_setzero_si512();
        }
        for (int m = 0; m < 4; ++m) {
          const __m512i u = rows(x[b], m);
          const __m512i sc = _mm512_permutexvar_epi32(
              _mm512_add_epi32(quarter, _mm512_set1_epi32(4 * m)), s16);  // 16s 4m .. 4m + 3
          for (int t = 0; t < N; ++t)
            acc[t] =
                _mm512_dpwssd_epi32(acc[t],
                                    _mm512_dpbusd_epi32(_mm512_setzero_si512(), u,
                                                        _mm512_loadu_si512(ys[t][b].qs + 64 * m)),
                                    sc);
        }
        for (int t = 0; t < N; ++t) I[t] = _mm256_add_epi32(I[t], fold(acc[t]));
      },
      iq1_d8<Block>);
}
// Rows 8m .. 8m + 7: their low index bytes and the dword h holding their high bits; row j's three
// at bit `at(j)` of h rotated to bits 8-10 (rot: 8 - at(j), mod 64, per row); fetched as
// grid_rows512.h's kLoads says.
template <bool kLoads>
__attribute__((always_inline)) inline __m512i iq1_rows8(const uint64_t* grid8, const uint8_t* qs8,
                                                        uint32_t h, __m512i rot) {
  const __m512i lo = _mm512_cvtepu8_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs8)));
  const __m512i idx = _mm512_ternarylogic_epi64(_mm512_rolv_epi64(_mm512_set1_epi32(int(h)), rot),
                                                _mm512_set1_epi64(0x700), lo, 0xEA);
  return grid_rows64<kLoads>(grid8, idx);
}
// i16 lane pairs (2c, 2c + 1) holding v's word c.
inline __m256i doubled16(__m128i v) {
  const __m256i w = _mm256_cvtepu16_epi32(v);
  return _mm256_or_si256(w, _mm256_slli_epi32(w, 16));
}

template <int N, bool kGather, bool kLoads = false>
void tile_iq1_s_avx512(const BlockIq1S* x, const BlockQ8K* const* ys, int64_t n, float* out) {
  if constexpr (kGather) {
    const uint64_t* grid8 = iq1_grid8();
    // group 2m + j / 4's qh in h's half j / 4; row j % 4's high bits at 3 (j % 4) of it
    const __m512i rot = _mm512_setr_epi64(8, 5, 2, 63, 56, 53, 50, 47);
    iq1_gather<N>(
        x, ys, n, out,
        [&](const BlockIq1S& b, int m) {
          uint32_t h;
          std::memcpy(&h, b.qh + 2 * m, 4);
          return iq1_rows8<kLoads>(grid8, b.qs + 8 * m, h, rot);
        },
        [](const BlockIq1S& b, __m256i& o16) {  // a group's scale and offset for both its 16s
          const __m128i qh = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qh));
          const __m128i s = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(qh, 11), _mm_set1_epi16(14)),
                                         _mm_set1_epi16(1));
          const __m128i f =  // the delta's sign ? -9 : -7
              _mm_sub_epi16(_mm_set1_epi16(-7),
                            _mm_and_si128(_mm_srli_epi16(qh, 14), _mm_set1_epi16(2)));
          o16 = doubled16(_mm_mullo_epi16(s, f));
          return doubled16(s);
        });
  } else {
    iq1_avx512<N>(x, ys, n, out,
                  [](const BlockIq1S& b, int ib, const uint64_t* g, int& s0, int& s1,
                     int16_t* off) { return iq1s_tile_group(b, ib, g, s0, s1, off); });
  }
}

template <int N, bool kGather, bool kLoads = false>
void tile_iq1_m_avx512(const BlockIq1M* x, const BlockQ8K* const* ys, int64_t n, float* out) {
  if constexpr (kGather) {
    const uint64_t* grid8 = iq1_grid8();
    // row j's nibble j of the four qh bytes: three high bits, then the delta's sign
    const __m512i rot = _mm512_setr_epi64(8, 4, 0, 60, 56, 52, 48, 44);
    const __m512i twos = _mm512_set1_epi8(2);
    iq1_gather<N>(
        x, ys, n, out,
        [&](const BlockIq1M& b, int m) {
          uint32_t h;
          std::memcpy(&h, b.qh + 4 * m, 4);
          const __m512i g = iq1_rows8<kLoads>(grid8, b.qs + 8 * m, h, rot);
          // + 2 (delta +1/8) on the rows whose delta bit is clear
          return _mm512_mask_add_epi64(g, __mmask8(~_pext_u32(h, 0x88888888u)), g, twos);
        },
        [](const BlockIq1M& b, __m256i& o16) {  // 16 c's s at 3 (c % 4) of scales word c / 4
          int64_t words;
          std::memcpy(&words, b.scales, 8);
          const __m256i w =
              _mm256_shuffle_epi8(_mm256_set1_epi64x(words),
                                  _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3,
                                                   4, 5, 4, 5, 4, 5, 4, 5, 6, 7, 6, 7, 6, 7, 6, 7));
          const __m256i s3 = _mm256_and_si256(
              _mm256_srlv_epi16(w,
                                _mm256_setr_epi16(0, 3, 6, 9, 0, 3, 6, 9, 0, 3, 6, 9, 0, 3, 6, 9)),
              _mm256_set1_epi16(7));
          const __m256i s = _mm256_or_si256(_mm256_slli_epi16(s3, 1), _mm256_set1_epi16(1));
          o16 = _mm256_mullo_epi16(s, _mm256_set1_epi16(-9));
          return s;
        });
  } else {
    const DeltaRow* deltas = iq1m_deltas();
    iq1_avx512<N>(
        x, ys, n, out,
        [deltas](const BlockIq1M& b, int ib, const uint64_t* g, int& s0, int& s1, int16_t* off) {
          return iq1m_tile_group<true>(b, ib, g, deltas, s0, s1, off);
        });
  }
}

// IQ4_XS: 4-bit indices into IQ4_NL's table (signed); |w| against the activations with w's signs.
template <int N>
void tile_iq4_xs_avx512(const BlockIq4Xs* x, const BlockQ8K* const* ys, int64_t n, float* out) {
  const __m512i table =
      _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(iq::kvalues_iq4nl)));
  const __m512i m4 = _mm512_set1_epi8(0xF);
  // 128-bit lanes of 16 bytes: group ib's low nibbles, its high, group ib + 1's low, its high.
  const __m512i nib_shift = _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0);
  avx2::sb_rows<N, false>(
      x, sizeof(BlockIq4Xs), 0, 0, n, ys, 1.0f, out, [&](int64_t b, __m256i* I, __m256i*) {
        const uint8_t* qs = x[b].qs;
        const unsigned sh = x[b].scales_h;
        __m512i isum[N];
        for (int t = 0; t < N; ++t) isum[t] = _mm512_setzero_si512();
        for (int ib = 0; ib < 8; ib += 2, qs += 32) {
          const __m512i q =
              _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs)));
          const __m512i idx =
              _mm512_and_si512(_mm512_srlv_epi64(_mm512_shuffle_i64x2(q, q, 0x50), nib_shift), m4);
          const __m512i w = _mm512_shuffle_epi8(table, idx);
          const __m512i aw = _mm512_abs_epi8(w);
          const __mmask64 neg = _mm512_movepi8_mask(w);
          const int l = x[b].scales_l[ib / 2];
          const int ls1 = ((l & 0xf) | (((sh >> (2 * ib)) & 3) << 4)) - 32;
          const int ls2 = ((l >> 4) | (((sh >> (2 * ib + 2)) & 3) << 4)) - 32;
          const __m512i sc = two_halves16(ls1, ls2);
          for (int t = 0; t < N; ++t) {
            const __m512i q8 = negate_where(_mm512_loadu_si512(ys[t][b].qs + 32 * ib), neg);
            isum[t] = _mm512_dpwssd_epi32(isum[t], _mm512_maddubs_epi16(aw, q8), sc);
          }
        }
        for (int t = 0; t < N; ++t) I[t] = fold(isum[t]);
      });
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
// NVFP4: x86.h's body with vpdpbusd for the 4-element sums (AVX2's bits).
float dot_nvfp4(const BlockNvfp4* x, const BlockQ8_0* y, int64_t n) {
  float r;
  x86::nvfp4_rows<DotVnni, 1>(x, &y, n, &r);
  return r;
}
void tile_nvfp4(const BlockNvfp4* x, const BlockQ8_0* const* ys, int n_tok, int64_t n, float* out) {
  with_n(n_tok, [&](auto N) { x86::nvfp4_rows<DotVnni, N>(x, ys, n, out); });
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

// The low-bit K and IQ types: tiles, and one token as the tile of one.
#define EXPERTD_AVX512_KERNEL(name, Block)                                                        \
  void tile_##name(const Block* x, const BlockQ8K* const* ys, int n_tok, int64_t n, float* out) { \
    with_n(n_tok, [&](auto N) { tile_##name##_avx512<N>(x, ys, n, out); });                       \
  }                                                                                               \
  float dot_##name(const Block* x, const BlockQ8K* y, int64_t n) {                                \
    float r;                                                                                      \
    tile_##name##_avx512<1>(x, &y, n, &r);                                                        \
    return r;                                                                                     \
  }
EXPERTD_AVX512_KERNEL(q2_k, BlockQ2K)
EXPERTD_AVX512_KERNEL(q3_k, BlockQ3K)
EXPERTD_AVX512_KERNEL(iq4_xs, BlockIq4Xs)
#undef EXPERTD_AVX512_KERNEL
// IQ2_XXS without VBMI (avx512_vbmi.cpp's body runs where the CPU has it, below).
void tile_iq2_xxs_plain(const BlockIq2Xxs* x, const BlockQ8K* const* ys, int n_tok, int64_t n,
                        float* out) {
  with_n(n_tok, [&](auto N) { tile_iq2_xxs_avx512<N>(x, ys, n, out); });
}
// The grid types whose rows are gathered where gathers are fast.
#define EXPERTD_AVX512_GATHER_KERNEL(name, Block)                                                 \
  void tile_##name(const Block* x, const BlockQ8K* const* ys, int n_tok, int64_t n, float* out) { \
    with_n(n_tok, [&](auto N) {                                                                   \
      gathers_slow() ? tile_##name##_avx512<N, false>(x, ys, n, out)                              \
                     : tile_##name##_avx512<N, true>(x, ys, n, out);                              \
    });                                                                                           \
  }                                                                                               \
  float dot_##name(const Block* x, const BlockQ8K* y, int64_t n) {                                \
    float r;                                                                                      \
    gathers_slow() ? tile_##name##_avx512<1, false>(x, &y, n, &r)                                 \
                   : tile_##name##_avx512<1, true>(x, &y, n, &r);                                 \
    return r;                                                                                     \
  }
EXPERTD_AVX512_GATHER_KERNEL(iq3_xxs_plain, BlockIq3Xxs)
EXPERTD_AVX512_GATHER_KERNEL(iq3_s_plain, BlockIq3S)
#undef EXPERTD_AVX512_GATHER_KERNEL
// IQ1_S and IQ1_M: rows looked up one at a time where gathers are slow, else gathered, by loads
// where isa.h's gathers_by_loads says (AMD's Zen 4).
#define EXPERTD_AVX512_IQ1_KERNEL(name, Block)                                                    \
  void tile_##name(const Block* x, const BlockQ8K* const* ys, int n_tok, int64_t n, float* out) { \
    with_n(n_tok, [&](auto N) {                                                                   \
      if (gathers_slow())                                                                         \
        tile_##name##_avx512<N, false>(x, ys, n, out);                                            \
      else if (gathers_by_loads())                                                                \
        tile_##name##_avx512<N, true, true>(x, ys, n, out);                                       \
      else                                                                                        \
        tile_##name##_avx512<N, true>(x, ys, n, out);                                             \
    });                                                                                           \
  }                                                                                               \
  float dot_##name(const Block* x, const BlockQ8K* y, int64_t n) {                                \
    float r;                                                                                      \
    tile_##name(x, &y, 1, n, &r);                                                                 \
    return r;                                                                                     \
  }
EXPERTD_AVX512_IQ1_KERNEL(iq1_s, BlockIq1S)
EXPERTD_AVX512_IQ1_KERNEL(iq1_m, BlockIq1M)
#undef EXPERTD_AVX512_IQ1_KERNEL

// The grid types on avx512_vbmi.cpp's bodies where the CPU has VBMI, GFNI and BITALG (and, for
// those that gather, gathers are fast): the same bits; else `fallback`, this file's bodies or
// AVX2's (IQ2_XS and IQ2_S have none here). IQ2_XXS and IQ3_XXS look their rows up by byte
// permutes, the others gather.
#define EXPERTD_AVX512_VBMI_KERNEL(name, Block, gathers, fallback)                                \
  void tile_##name(const Block* x, const BlockQ8K* const* ys, int n_tok, int64_t n, float* out) { \
    if (avx512_vbmi::usable() && !(gathers && gathers_slow()))                                    \
      return avx512_vbmi::tile_##name(x, ys, n_tok, n, out);                                      \
    fallback(x, ys, n_tok, n, out);                                                               \
  }                                                                                               \
  float dot_##name(const Block* x, const BlockQ8K* y, int64_t n) {                                \
    float r;                                                                                      \
    tile_##name(x, &y, 1, n, &r);                                                                 \
    return r;                                                                                     \
  }
EXPERTD_AVX512_VBMI_KERNEL(iq2_xxs, BlockIq2Xxs, false, tile_iq2_xxs_plain)
EXPERTD_AVX512_VBMI_KERNEL(iq3_xxs, BlockIq3Xxs, false, tile_iq3_xxs_plain)
EXPERTD_AVX512_VBMI_KERNEL(iq2_xs, BlockIq2Xs, true, avx2::tile_iq2_xs)
EXPERTD_AVX512_VBMI_KERNEL(iq2_s, BlockIq2S, true, avx2::tile_iq2_s)
EXPERTD_AVX512_VBMI_KERNEL(iq3_s, BlockIq3S, true, tile_iq3_s_plain)
#undef EXPERTD_AVX512_VBMI_KERNEL

// F16 rows against F16 activations: avx2.cpp's four FMA chains of eight lanes, two to a 512-bit
// register (lanes 0-7 chain k, 8-15 chain k + 1), each lane the same products in the same order,
// and the same sum at the end: its bits, with half the instructions.
float dot_f16(const uint16_t* a, const uint16_t* b, int64_t n) {
  auto widen = [](const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  };
  __m512 acc01 = _mm512_setzero_ps(), acc23 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    x86::prefetch_ahead(a + i);
    acc01 = _mm512_fmadd_ps(widen(a + i), widen(b + i), acc01);
    acc23 = _mm512_fmadd_ps(widen(a + i + 16), widen(b + i + 16), acc23);
  }
  const __m256 s01 =
      _mm256_add_ps(_mm512_castps512_ps256(acc01),
                    _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc01), 1)));
  const __m256 s23 =
      _mm256_add_ps(_mm512_castps512_ps256(acc23),
                    _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc23), 1)));
  float s = hsum(_mm256_add_ps(s01, s23));
  for (; i < n; ++i) s += fp16_to_fp32(a[i]) * fp16_to_fp32(b[i]);
  return s;
}

// BF16: avx2.cpp's even and odd chains, 32 elements a step in one 512-bit load: lanes 0-7 of the
// even register are AVX2's chain 0, lanes 8-15 its chain 2, of the odd register chains 1 and 3;
// the sum at the end is AVX2's (0 + 1) + (2 + 3): its bits.
float dot_bf16(const uint16_t* a, const uint16_t* b, int64_t n) {
  const __m512i hi = _mm512_set1_epi32(int(0xFFFF0000u));
  __m512 even = _mm512_setzero_ps(), odd = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    x86::prefetch_ahead(a + i);
    const __m512i w = _mm512_loadu_si512(a + i), x = _mm512_loadu_si512(b + i);
    even = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(w, 16)),
                           _mm512_castsi512_ps(_mm512_slli_epi32(x, 16)), even);
    odd = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(w, hi)),
                          _mm512_castsi512_ps(_mm512_and_si512(x, hi)), odd);
  }
  const __m512 pairs = _mm512_add_ps(even, odd);  // lanes 0-7: chains 0 + 1, 8-15: 2 + 3
  float s =
      hsum(_mm256_add_ps(_mm512_castps512_ps256(pairs),
                         _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(pairs), 1))));
  for (; i < n; ++i) s += bf16_to_fp32(a[i]) * bf16_to_fp32(b[i]);
  return s;
}

// The activations' quantizers, 16 floats a step: quantize_acts.h's arithmetic (the same products,
// its rounding — nearbyint's and nearest_int's round-half-even — and its clamp), so the same bytes.
void quantize_q8_0(const float* x, BlockQ8_0* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK8_0; ++b, x += kQK8_0) {
    const __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    const float d = amax / 127.f;
    const __m512 id = _mm512_set1_ps(amax != 0.0f ? 127.f / amax : 0.0f);
    y[b].d = fp32_to_fp16(d);
    // cvtps rounds half to even (the default MXCSR), as nearbyint does; |x * id| <= 127.
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y[b].qs),
                     _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v0, id))));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y[b].qs + 16),
                     _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v1, id))));
  }
}

void quantize_q8_k(const float* x, BlockQ8K* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b, x += kQK_K) {
    __m512 m = _mm512_setzero_ps();
    for (int j = 0; j < kQK_K; j += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(x + j)));
    const float amax = _mm512_reduce_max_ps(m);
    if (amax == 0) {
      std::memset(&y[b], 0, sizeof y[b]);
      continue;
    }
    // The signed value of the first element of magnitude amax (the reference keeps the first).
    float max = 0;
    for (int j = 0; j < kQK_K; j += 16) {
      const __mmask16 hit = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(x + j)),
                                               _mm512_set1_ps(amax), _CMP_EQ_OQ);
      if (hit) {
        max = x[j + __builtin_ctz(hit)];
        break;
      }
    }
    const float iscale = -127.f / max;
    const __m512 s = _mm512_set1_ps(iscale), magic = _mm512_set1_ps(12582912.f);
    for (int j = 0; j < kQK_K; j += 16) {  // nearest_int(iscale * x), at most 127
      const __m512i bits =
          _mm512_castps_si512(_mm512_add_ps(_mm512_mul_ps(s, _mm512_loadu_ps(x + j)), magic));
      const __m512i q =
          _mm512_min_epi32(_mm512_sub_epi32(_mm512_and_si512(bits, _mm512_set1_epi32(0x007fffff)),
                                            _mm512_set1_epi32(0x00400000)),
                           _mm512_set1_epi32(127));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(y[b].qs + j), _mm512_cvtsepi32_epi8(q));
      y[b].bsums[j / 16] = static_cast<int16_t>(_mm512_reduce_add_epi32(q));
    }
    y[b].d = 1 / iscale;
  }
}

}  // namespace kernels::avx512
