// Small helpers of the x86 SIMD kernels (AVX2 and AVX-512 files; their flags enable AVX2 and
// F16C), and the one body of the 32-element block types' dots (Q8_0, MXFP4) that both files
// instantiate with their instruction for a block's 4-element sums.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/dequant.h"
#include "kernels/fp16.h"
#include "kernels/quant_blocks.h"

namespace kernels::x86 {

inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

// How far ahead the row dots that prefetch for themselves (F16, BF16, NVFP4, TQ2_0) reach: a line
// into L2 (T1) per 64 bytes of the row, ~16 KiB on, so the stream runs on into the rows after it.
// A burst of a whole row's lines at once (the matrix-vector driver's prefetch for the other types)
// held a BF16 product at ~0.7 of the memory stream; a line a step, 4-16 KiB on, ~0.9 (Intel Xeon,
// AVX2, 2 threads; expert-bench gemv). In the super-block types' shared loop (avx2.h's sb_chunk)
// the same took Q2_K's rows from 0.66-0.76 to 0.46-0.59 and IQ3_XXS's from 0.49 to 0.37: those
// keep the driver's prefetch.
// An asm statement: with the intrinsic, GCC 12 left the prefetch out of NVFP4's loop once it
// became a template over tokens, without a word.
inline void prefetch_ahead(const void* p) {
  asm volatile("prefetcht1 %0" : : "m"(*(static_cast<const char*>(p) + 16384)));
}

// The sum of 8 i32 lanes.
inline int hsum_i32(__m256i a) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
  s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

// Bit i of a 32-bit word as byte i of a register: 0xFF where it is set (bytes_where_set) or
// where it is clear (bytes_where_clear); a broadcast, one vpshufb, one vpand and one vpcmpeqb.
__attribute__((always_inline)) inline __m256i bit_in_byte(uint32_t w) {
  const __m256i spread =
      _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303);
  return _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(w)), spread),
                          _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull)));
}
__attribute__((always_inline)) inline __m256i bytes_where_set(uint32_t w) {
  return _mm256_cmpeq_epi8(bit_in_byte(w),
                           _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull)));
}
__attribute__((always_inline)) inline __m256i bytes_where_clear(uint32_t w) {
  return _mm256_cmpeq_epi8(bit_in_byte(w), _mm256_setzero_si256());
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

// Q3_K's 16 6-bit scales (12 packed bytes) as int8, less 32: four words at once.
inline __m128i q3k_scales(const uint8_t* packed) {
  uint32_t a[3];
  std::memcpy(a, packed, 12);
  const uint32_t k1 = 0x03030303, k2 = 0x0f0f0f0f;
  return _mm_sub_epi8(
      _mm_set_epi32(static_cast<int>(((a[1] >> 4) & k2) | (((a[2] >> 6) & k1) << 4)),
                    static_cast<int>(((a[0] >> 4) & k2) | (((a[2] >> 4) & k1) << 4)),
                    static_cast<int>((a[1] & k2) | (((a[2] >> 2) & k1) << 4)),
                    static_cast<int>((a[0] & k2) | ((a[2] & k1) << 4))),
      _mm_set1_epi8(32));
}

// Q4_K's (kFive: Q5_K's) 256 codes of one super-block in element order: 0..15 from the nibbles
// qs (0..31 with the fifth bits qh; sub-block s's are bit s of qh's bytes).
template <bool kFive>
inline void k45_codes(const uint8_t* qs, const uint8_t* qh, uint8_t* code) {
  const __m256i m4 = _mm256_set1_epi8(0xF), one = _mm256_set1_epi8(1);
  const __m256i hb =
      kFive ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh)) : _mm256_setzero_si256();
  for (int j = 0; j < 4; ++j) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * j));
    __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    if (kFive) {
      const __m256i b0 = _mm256_and_si256(_mm256_srl_epi16(hb, _mm_cvtsi32_si128(2 * j)), one);
      const __m256i b1 = _mm256_and_si256(_mm256_srl_epi16(hb, _mm_cvtsi32_si128(2 * j + 1)), one);
      lo = _mm256_or_si256(lo, _mm256_slli_epi16(b0, 4));
      hi = _mm256_or_si256(hi, _mm256_slli_epi16(b1, 4));
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(code + 64 * j), lo);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(code + 64 * j + 32), hi);
  }
}

// Q6_K's 256 codes (0..63, the value + 32) of one super-block in element order.
inline void q6k_codes(const BlockQ6K& b, uint8_t* code) {
  const __m256i m4 = _mm256_set1_epi8(0xF), m2 = _mm256_set1_epi8(3);
  for (int h = 0; h < 2; ++h) {
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh + 32 * h));
    for (int g = 0; g < 4; ++g) {  // elements 128h + 32g .. + 31
      const __m256i ql =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.ql + 64 * h + 32 * (g & 1)));
      const __m256i lo =
          _mm256_and_si256(_mm256_srl_epi16(ql, _mm_cvtsi32_si128(4 * (g >> 1))), m4);
      const __m256i hi = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * g)), m2);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(code + 128 * h + 32 * g),
                          _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)));
    }
  }
}
// Q2_K's 256 codes (0..3) of one super-block in element order.
inline void q2k_codes(const BlockQ2K& b, uint8_t* code) {
  const __m256i m3 = _mm256_set1_epi8(3);
  for (int h = 0; h < 2; ++h) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 32 * h));
    for (int j = 0; j < 4; ++j)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(code + 128 * h + 32 * j),
                          _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * j)), m3));
  }
}
// Q3_K's 256 codes (0..7, the value + 4: the low bits and the high bit) in element order.
inline void q3k_codes(const BlockQ3K& b, uint8_t* code) {
  const __m256i m3 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
  const __m256i hm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.hmask));
  for (int h = 0; h < 2; ++h) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 32 * h));
    for (int j = 0; j < 4; ++j) {
      const int k = 4 * h + j;
      const __m256i lo = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * j)), m3);
      const __m256i hb = _mm256_and_si256(_mm256_srl_epi16(hm, _mm_cvtsi32_si128(k)), one);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(code + 32 * k),
                          _mm256_or_si256(lo, _mm256_slli_epi16(hb, 2)));
    }
  }
}

// IQ2_XXS's group of 32 weights (8 bytes at q; aux, its last 4, little-endian): the 4 grid rows
// (magnitudes, element order), and bit i set where element i is negative (ksigns_iq2xs). The
// group's scale is 2 (aux >> 28) + 1.
inline __m256i iq2xxs_grid(const uint8_t* q) {
  return _mm256_setr_epi64x(int64_t(iq::iq2xxs_grid[q[0]]), int64_t(iq::iq2xxs_grid[q[1]]),
                            int64_t(iq::iq2xxs_grid[q[2]]), int64_t(iq::iq2xxs_grid[q[3]]));
}
// The sign bytes of a whole IQ2_XXS block (its 64 bytes of qs): out[4 ib + l] is ksigns_iq2xs of
// group ib's l-th 7-bit index (the index, its parity as the eighth bit), so the dword at
// out + 4 ib is iq2xxs_negative of group ib's aux. A few vector operations for the block's 32
// indices instead of a lookup or a parity fold per index.
// aux_signs: the same from the block's eight aux dwords in a register (IQ3_XXS keeps them side by
// side after its grid indices).
inline void aux_signs(__m256i a, uint8_t* out) {
  // the four 7-bit fields of each aux (bits 0, 7, 14, 21) into its four bytes
  __m256i t = _mm256_and_si256(a, _mm256_set1_epi32(0x7F));
  t = _mm256_or_si256(t, _mm256_and_si256(_mm256_slli_epi32(a, 1), _mm256_set1_epi32(0x7F00)));
  t = _mm256_or_si256(t, _mm256_and_si256(_mm256_slli_epi32(a, 2), _mm256_set1_epi32(0x7F0000)));
  t = _mm256_or_si256(t, _mm256_and_si256(_mm256_slli_epi32(a, 3), _mm256_set1_epi32(0x7F000000)));
  // each byte's parity (its nibbles' parities, 0x80 where odd) into its eighth bit
  const __m256i parity = _mm256_setr_epi8(
      0, char(0x80), char(0x80), 0, char(0x80), 0, 0, char(0x80), char(0x80), 0, 0, char(0x80), 0,
      char(0x80), char(0x80), 0, 0, char(0x80), char(0x80), 0, char(0x80), 0, 0, char(0x80),
      char(0x80), 0, 0, char(0x80), 0, char(0x80), char(0x80), 0);
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i p =
      _mm256_xor_si256(_mm256_shuffle_epi8(parity, _mm256_and_si256(t, m4)),
                       _mm256_shuffle_epi8(parity, _mm256_and_si256(_mm256_srli_epi16(t, 4), m4)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_or_si256(t, p));
}
inline void iq2xxs_block_signs(const uint8_t* qs, uint8_t* out) {
  const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs));
  const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32));
  const __m256i odd = _mm256_setr_epi32(1, 3, 5, 7, 1, 3, 5, 7);  // each group's aux dword
  aux_signs(_mm256_blend_epi32(_mm256_permutevar8x32_epi32(lo, odd),
                               _mm256_permutevar8x32_epi32(hi, odd), 0xF0),
            out);
}
inline uint32_t iq2xxs_negative(uint32_t aux) {
  return iq::ksigns_iq2xs[aux & 127] | iq::ksigns_iq2xs[(aux >> 7) & 127] << 8 |
         iq::ksigns_iq2xs[(aux >> 14) & 127] << 16 |
         uint32_t(iq::ksigns_iq2xs[(aux >> 21) & 127]) << 24;
}

// k fp16 values `stride` bytes apart as 8 floats (lanes past k zero).
__attribute__((always_inline)) inline __m256 halves8(const uint8_t* p, size_t stride, int k) {
  auto h = [&](int i) {
    uint16_t v = 0;
    if (i < k) std::memcpy(&v, p + i * stride, 2);
    return static_cast<short>(v);
  };
  return _mm256_cvtph_ps(_mm_setr_epi16(h(0), h(1), h(2), h(3), h(4), h(5), h(6), h(7)));
}

// Lane k: the sum of v[k]'s 8 lanes (8 blocks' sums reduced together).
inline __m256i sums8(const __m256i* v) {
  const __m256i h01 = _mm256_hadd_epi32(v[0], v[1]), h23 = _mm256_hadd_epi32(v[2], v[3]);
  const __m256i h45 = _mm256_hadd_epi32(v[4], v[5]), h67 = _mm256_hadd_epi32(v[6], v[7]);
  const __m256i lo = _mm256_hadd_epi32(h01, h23), hi = _mm256_hadd_epi32(h45, h67);
  return _mm256_add_epi32(_mm256_permute2x128_si256(lo, hi, 0x20),
                          _mm256_permute2x128_si256(lo, hi, 0x31));
}

// The 32-element block types: a block's 32 signed values, and the scales of up to 8 blocks.
struct Q8_0Values {
  static __m256i values(const BlockQ8_0& b) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs));
  }
  static __m256 scales(const BlockQ8_0* b, int k) {
    return halves8(reinterpret_cast<const uint8_t*>(&b->d), sizeof(BlockQ8_0), k);
  }
};
struct Mxfp4Values {
  static __m256i values(const BlockMxfp4& b) {  // low nibbles (elements 0..15), then high
    const __m256i table = _mm256_broadcastsi128_si256(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(kMxfp4Doubled)));
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs));
    return _mm256_shuffle_epi8(
        table, _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0xF)));
  }
  // e8m0_half of up to 8 blocks at once (lanes past k zero).
  __attribute__((always_inline)) static __m256 scales(const BlockMxfp4* b, int k) {
    auto e = [&](int i) { return i < k ? int(b[i].e) : -1; };
    const __m256i v = _mm256_setr_epi32(e(0), e(1), e(2), e(3), e(4), e(5), e(6), e(7));
    const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(v, _mm256_set1_epi32(1)), 23);
    const __m256i sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), v);  // e < 2; -1: 0
    return _mm256_castsi256_ps(
        _mm256_blendv_epi8(sub, normal, _mm256_cmpgt_epi32(v, _mm256_set1_epi32(1))));
  }
};

// One weight row of a 32-element block type against N token rows. Block b's exact sum I (|w|
// against the activations with w's signs; Dot::dot gives its 4-element sums) goes to float lane
// b % 8: acc[b % 8] + (dx * dy) * I, block by block; the result is the lanes summed as hsum does,
// ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)). Eight blocks a step (kb < 8: a row's last).
// The matrix-matrix panels (gemm_*.cpp) compute the same numbers.
template <class Dot, class V, class Block, int N, bool kFull>
__attribute__((always_inline)) inline void b32_step(const Block* x, const BlockQ8_0* const* ys,
                                                    int64_t b, int kb, __m256* acc) {
  if constexpr (kFull) kb = 8;
  __m256i w[8], aw[8];
  for (int k = 0; k < 8; ++k) {
    w[k] = kFull || k < kb ? V::values(x[b + k]) : _mm256_setzero_si256();
    aw[k] = _mm256_abs_epi8(w[k]);
  }
  const __m256 dx = V::scales(x + b, kb);
  const __m256 keep = _mm256_castsi256_ps(
      _mm256_cmpgt_epi32(_mm256_set1_epi32(kb), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
  for (int t = 0; t < N; ++t) {
    __m256i d[8];
    for (int k = 0; k < 8; ++k)
      d[k] =
          kFull || k < kb
              ? Dot::dot(aw[k],
                         _mm256_sign_epi8(
                             _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ys[t][b + k].qs)),
                             w[k]))
              : _mm256_setzero_si256();
    const __m256 dy = halves8(reinterpret_cast<const uint8_t*>(&ys[t][b].d), sizeof(BlockQ8_0), kb);
    const __m256 p = _mm256_mul_ps(_mm256_mul_ps(dx, dy), _mm256_cvtepi32_ps(sums8(d)));
    const __m256 sum = _mm256_add_ps(acc[t], p);
    acc[t] = kFull ? sum : _mm256_blendv_ps(acc[t], sum, keep);
  }
}
template <class Dot, class V, class Block, int N>
void tile_b32(const Block* x, const BlockQ8_0* const* ys, int64_t n, float* out) {
  __m256 acc[N];
  for (int t = 0; t < N; ++t) acc[t] = _mm256_setzero_ps();
  const int64_t nb = n / kQK8_0;
  int64_t b = 0;
  for (; b + 8 <= nb; b += 8) b32_step<Dot, V, Block, N, true>(x, ys, b, 8, acc);
  if (b < nb) b32_step<Dot, V, Block, N, false>(x, ys, b, int(nb - b), acc);
  for (int t = 0; t < N; ++t) out[t] = hsum(acc[t]);
}

// NVFP4 against N tokens (the dot is N = 1). A block's 32 code bytes in one register: sub-blocks
// 0 and 1 in the low 128-bit lane, 2 and 3 in the high one (each sub-block's 8 bytes, low nibbles
// its elements 0-7, high nibbles 8-15). The nibbles looked up in both lanes at once, then unpacked
// so that one register holds sub-blocks 0 and 2 and the other 1 and 3, once for all the tokens;
// each token's activations' 16 bytes (Q8_0 blocks 2b and 2b + 1, first or second half) loaded into
// the two lanes, no shuffle. Dot::dot gives the 4-element sums (|w| against the activations with
// w's signs): each instruction set's, the same integers, so the same bits; one vphaddd makes them
// the 8-element sums of every sub-block k's half p (elements 8p ..) in lane 2k + p (lanes 0-3
// sub-blocks 0 and 1, 4-7 sub-blocks 2 and 3), times the sub-block's scale (a table of the 256
// UE4M3 values) and the token's activation scale, into one chain of eight lanes per token. The
// interleaved rows (rows8_body.h's nvfp4_group) keep the same eight sums per row.
template <class Dot, int N>
__attribute__((always_inline)) inline void nvfp4_rows(const BlockNvfp4* x,
                                                      const BlockQ8_0* const* ys, int64_t n,
                                                      float* out) {
  struct Ue4m3 {
    float v[256];
    Ue4m3() {
      for (int i = 0; i < 256; ++i) v[i] = ue4m3_half(static_cast<uint8_t>(i));
    }
  };
  static const Ue4m3 kScale;
  const __m256i table =
      _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kMxfp4Doubled)));
  const __m256i m4 = _mm256_set1_epi8(0xF);
  const __m256i halves = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
  __m256 acc[N];
  for (int t = 0; t < N; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / 64; ++b) {
    prefetch_ahead(x + b);
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs));
    const __m256i lo = _mm256_shuffle_epi8(table, _mm256_and_si256(q, m4));
    const __m256i hi = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(q, 4), m4));
    const __m256i w02 = _mm256_unpacklo_epi64(lo, hi), w13 = _mm256_unpackhi_epi64(lo, hi);
    const __m256i a02 = _mm256_abs_epi8(w02), a13 = _mm256_abs_epi8(w13);
    // the sub-blocks' scales, each in its two lanes
    const __m256 v01 = _mm256_blend_ps(_mm256_broadcast_ss(kScale.v + x[b].d[0]),
                                       _mm256_broadcast_ss(kScale.v + x[b].d[1]), 0xCC);
    const __m256 v23 = _mm256_blend_ps(_mm256_broadcast_ss(kScale.v + x[b].d[2]),
                                       _mm256_broadcast_ss(kScale.v + x[b].d[3]), 0xCC);
    const __m256 v = _mm256_blend_ps(v01, v23, 0xF0);
    for (int t = 0; t < N; ++t) {
      const BlockQ8_0 &y0 = ys[t][2 * b], &y1 = ys[t][2 * b + 1];
      const __m256i p02 = Dot::dot(
          a02, _mm256_sign_epi8(_mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(y1.qs),
                                                    reinterpret_cast<const __m128i*>(y0.qs)),
                                w02));
      const __m256i p13 = Dot::dot(
          a13, _mm256_sign_epi8(_mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(y1.qs + 16),
                                                    reinterpret_cast<const __m128i*>(y0.qs + 16)),
                                w13));
      // the two blocks' scales widened at once, each into its four lanes
      const __m256 dy = _mm256_permutevar8x32_ps(
          _mm256_cvtph_ps(_mm_insert_epi16(_mm_cvtsi32_si128(y0.d), y1.d, 4)), halves);
      acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(v, dy),
                               _mm256_cvtepi32_ps(_mm256_hadd_epi32(p02, p13)), acc[t]);
    }
  }
  for (int t = 0; t < N; ++t) out[t] = hsum(acc[t]);
}

}  // namespace kernels::x86
