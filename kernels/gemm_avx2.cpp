// Prefill as matrix-matrix work on AVX2 (no VNNI): panels of 8 weight rows x 8 tokens. The
// weights of 8 rows are unpacked once per panel, for every token of the batch; the activations are
// laid out once per matrix so that one 32-byte load holds four consecutive elements of 8 tokens,
// and each load serves 8 rows. Per row and 4 elements, with the row's 4 bytes broadcast, one of:
//   - the K-quants (unsigned codes: Q4_K, Q5_K, Q2_K, Q3_K, Q6_K): vpmaddubsw of the codes against
//     the activations, summed in 16 bits over a sub-block (or a part of one, where 16 bits would
//     overflow), then one vpmaddwd by the sub-block's scale; the mins (Q4_K, Q5_K, Q2_K) or the
//     codes' bias (Q3_K, Q6_K) from the activations' sub-block sums;
//   - IQ2_XXS (|w| <= 43) and the other grid types (IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S: |w| <= 62;
//     IQ1_S, IQ1_M: 8 w, |8 w| <= 9): the activations biased to unsigned (q + 128) against the
//     signed values, vpmaddubsw, vpmaddwd by the scale (IQ1's after 4 steps summed in 16 bits);
//     the bias's share (128 times the scaled values' sum, known per row) taken off once per
//     super-block;
//   - IQ4_XS (|w| <= 127): the activations' magnitudes against the values given the activations'
//     signs (|q| <= 127 in Q8_K);
//   - MXFP4 (|w| <= 12 doubled): the values + 12 as unsigned codes, summed in 16 bits over half
//     a block, 12 x the block's activation sum taken off;
//   - Q8_0: the magnitudes against the activations given the weights' signs.
//
// The arithmetic is the tiles' (avx2.h's sb_lanes, x86.h's tile_b32): each super-block's (or
// 32-block's) exact integer sums, then acc + (d * dy) * I (less (dmin * dy) * M) in float lane
// b % 8, the lanes summed in hsum's order at the end, so a token's result is bit for bit the same
// here, in a tile or as a single dot.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/dequant.h"
#include "kernels/fp16.h"
#include "kernels/gemm_drive.h"
#include "kernels/gemm_float.h"
#include "kernels/iq_grids.h"
#include "kernels/isa.h"
#include "kernels/kernels.h"
#include "kernels/x86.h"

namespace kernels::avx2 {

namespace {

constexpr int kRows = 8, kLanes = 8, kUnit = 256;

// One unit (a super-block, or 8 blocks of 32) of one weight row, unpacked.
struct WUnit {
  alignas(32) int8_t w[kUnit];   // the signed values, or the K-quants' and MXFP4's unsigned codes
  alignas(32) uint8_t a[kUnit];  // their magnitudes (Q8_0: the activations take w's signs)
  int16_t sc[16];                // the sub-blocks' integer scales
  int32_t f2[8];  // factors of sub-blocks 2j and 2j + 1's activation sums (i16 pair):
                  // their mins, or the code's bias times their scales
  int32_t corr;   // grid types: 128 * sum over sub-blocks of scale * values' sum
  float d, dmin;  // the super-block's scales
  float db[8];    // the 32-blocks' scales (Q8_0, MXFP4)
};

// One unit of 8 tokens' activations.
struct AUnit {
  alignas(32) int8_t q[kUnit / 4][kLanes][4];  // [k4][token][4 elements] (biased: + 128)
  alignas(32) int16_t s32[4][kLanes][2];       // Q8_K: sums of elements 64j .. + 31, + 32 .. + 63
  alignas(32) int16_t s16[8][kLanes][2];       // Q8_K: sums of elements 32j .. + 15, + 16 .. + 31
  alignas(32) float yd[8][kLanes];             // Q8_0: one per 32-block; Q8_K: yd[0]
  alignas(32) int32_t s_blk[8][kLanes];        // Q8_0: each 32-block's sum
};

enum class Form { Block32, Mxfp4, Codes, Biased, Signs };

void magnitudes(WUnit& w) {
  for (int i = 0; i < kUnit; i += 32)
    _mm256_store_si256(
        reinterpret_cast<__m256i*>(w.a + i),
        _mm256_abs_epi8(_mm256_load_si256(reinterpret_cast<const __m256i*>(w.w + i))));
}

void unpack_q8_0(const uint8_t* row, int64_t u, WUnit& w) {
  const BlockQ8_0* b = reinterpret_cast<const BlockQ8_0*>(row) + 8 * u;
  for (int k = 0; k < 8; ++k) {
    w.db[k] = fp16_to_fp32(b[k].d);
    std::memcpy(w.w + 32 * k, b[k].qs, 32);
  }
  magnitudes(w);
}

void unpack_mxfp4(const uint8_t* row, int64_t u, WUnit& w) {  // codes: the doubled value + 12
  const BlockMxfp4* b = reinterpret_cast<const BlockMxfp4*>(row) + 8 * u;
  const __m256i table = _mm256_add_epi8(
      _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kMxfp4Doubled))),
      _mm256_set1_epi8(12));
  for (int k = 0; k < 8; ++k) {
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[k].qs));
    _mm256_store_si256(
        reinterpret_cast<__m256i*>(w.w + 32 * k),
        _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q),
                                                    _mm256_set1_epi8(0xF))));
  }
  _mm256_storeu_ps(w.db, x86::Mxfp4Values::scales(b, 8));
}

inline int32_t pair16(int lo, int hi) {  // two i16 lanes
  return int32_t(uint32_t(uint16_t(lo)) | uint32_t(uint16_t(hi)) << 16);
}

template <bool kFive>
void unpack_k45(const uint8_t* row, int64_t u, WUnit& w) {
  const size_t stride = kFive ? sizeof(BlockQ5K) : sizeof(BlockQ4K);
  const uint8_t* blk = row + u * stride;
  uint16_t hd, hm;
  std::memcpy(&hd, blk, 2);
  std::memcpy(&hm, blk + 2, 2);
  w.d = fp16_to_fp32(hd), w.dmin = fp16_to_fp32(hm);
  uint8_t sm[16];
  k_scales_mins(blk + 4, sm);
  for (int s = 0; s < 8; ++s) w.sc[s] = sm[s];
  for (int j = 0; j < 4; ++j) w.f2[j] = pair16(sm[8 + 2 * j], sm[9 + 2 * j]);
  x86::k45_codes<kFive>(kFive ? blk + 48 : blk + 16, blk + 16, reinterpret_cast<uint8_t*>(w.w));
}

void unpack_q2_k(const uint8_t* row, int64_t u, WUnit& w) {
  const BlockQ2K& b = reinterpret_cast<const BlockQ2K*>(row)[u];
  w.d = fp16_to_fp32(b.d), w.dmin = fp16_to_fp32(b.dmin);
  for (int s = 0; s < 16; ++s) w.sc[s] = int16_t(b.scales[s] & 0xF);
  for (int j = 0; j < 8; ++j) w.f2[j] = pair16(b.scales[2 * j] >> 4, b.scales[2 * j + 1] >> 4);
  x86::q2k_codes(b, reinterpret_cast<uint8_t*>(w.w));
}

void unpack_q3_k(const uint8_t* row, int64_t u, WUnit& w) {  // codes 0..7, value = code - 4
  const BlockQ3K& b = reinterpret_cast<const BlockQ3K*>(row)[u];
  w.d = fp16_to_fp32(b.d);
  int8_t sc[16];
  q3k_scales(b.scales, sc);
  for (int s = 0; s < 16; ++s) w.sc[s] = int16_t(sc[s] - 32);
  for (int j = 0; j < 8; ++j) w.f2[j] = pair16(4 * w.sc[2 * j], 4 * w.sc[2 * j + 1]);
  x86::q3k_codes(b, reinterpret_cast<uint8_t*>(w.w));
}

void unpack_q6_k(const uint8_t* row, int64_t u, WUnit& w) {  // codes 0..63, value = code - 32
  const BlockQ6K& b = reinterpret_cast<const BlockQ6K*>(row)[u];
  w.d = fp16_to_fp32(b.d);
  for (int s = 0; s < 16; ++s) w.sc[s] = b.scales[s];
  for (int j = 0; j < 8; ++j) w.f2[j] = pair16(32 * w.sc[2 * j], 32 * w.sc[2 * j + 1]);
  x86::q6k_codes(b, reinterpret_cast<uint8_t*>(w.w));
}

void unpack_iq2_xxs(const uint8_t* row, int64_t u, WUnit& w) {
  const BlockIq2Xxs& b = reinterpret_cast<const BlockIq2Xxs*>(row)[u];
  const uint8_t* q = reinterpret_cast<const uint8_t*>(b.qs);
  w.d = fp16_to_fp32(b.d);
  int32_t corr = 0;
  for (int ib = 0; ib < 8; ++ib, q += 8) {
    uint32_t aux;
    std::memcpy(&aux, q + 4, 4);
    const __m256i g = x86::iq2xxs_grid(q);
    const uint32_t neg = x86::iq2xxs_negative(aux);
    const __m256i m = x86::bytes_where_set(neg);                   // 0xFF where negative
    const __m256i v = _mm256_sub_epi8(_mm256_xor_si256(g, m), m);  // -g where m is set
    _mm256_store_si256(reinterpret_cast<__m256i*>(w.w + 32 * ib), v);
    w.sc[ib] = int16_t(2 * (aux >> 28) + 1);
    const __m256i s =
        _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), v), _mm256_set1_epi16(1));
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    h = _mm_add_epi32(h, _mm_unpackhi_epi64(h, h));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xB1));
    corr += w.sc[ib] * _mm_cvtsi128_si32(h);
  }
  w.corr = 128 * corr;
}

// The other grid IQ types (iq_grids.h) as IQ2_XXS: group ib's signed values (|v| <= 62, so the
// biased activations' vpmaddubsw pairs stay below 2 x 255 x 62 < 2^15), the scales of its
// sub-blocks (kSub elements), and 128 x the scaled values' sum into corr.
template <int kSub>
void store_group(WUnit& w, int ib, __m256i v, int s0, int s1, int32_t& corr) {
  _mm256_store_si256(reinterpret_cast<__m256i*>(w.w + 32 * ib), v);
  const __m256i s =
      _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), v), _mm256_set1_epi16(1));
  auto sum4 = [](__m128i h) {  // elements 0-15 or 16-31
    h = _mm_add_epi32(h, _mm_unpackhi_epi64(h, h));
    return _mm_cvtsi128_si32(_mm_add_epi32(h, _mm_shuffle_epi32(h, 0xB1)));
  };
  const int h0 = sum4(_mm256_castsi256_si128(s)), h1 = sum4(_mm256_extracti128_si256(s, 1));
  if constexpr (kSub == 32) {
    w.sc[ib] = int16_t(s0);
  } else {
    w.sc[2 * ib] = int16_t(s0), w.sc[2 * ib + 1] = int16_t(s1);
  }
  corr += s0 * h0 + s1 * h1;
}

template <class Block>
void unpack_grid(const uint8_t* row, int64_t u, WUnit& w) {
  const Block& b = reinterpret_cast<const Block*>(row)[u];
  w.d = Grid<Block>::d(b);
  int32_t corr = 0;
  for (int ib = 0; ib < 8; ++ib) {
    const GridGroup q = Grid<Block>::group(b, ib);
    store_group<Grid<Block>::kSub>(w, ib, _mm256_sign_epi8(q.g, q.sg), q.s0, q.s1, corr);
  }
  w.corr = 128 * corr;
}

template <class Block>  // IQ1_S, IQ1_M: 8 x value, -9..9
void unpack_iq1(const uint8_t* row, int64_t u, WUnit& w) {
  const Block& b = reinterpret_cast<const Block*>(row)[u];
  w.d = Iq1<Block>::d(b);
  int32_t corr = 0;
  for (int ib = 0; ib < 8; ++ib) {
    const Iq1Group q = Iq1<Block>::group(b, ib);
    store_group<Iq1<Block>::kSub>(w, ib, _mm256_sub_epi8(q.u, _mm256_set1_epi8(9)), q.s0, q.s1,
                                  corr);
  }
  w.corr = 128 * corr;
}

void unpack_iq4_xs(const uint8_t* row, int64_t u, WUnit& w) {
  const BlockIq4Xs& b = reinterpret_cast<const BlockIq4Xs*>(row)[u];
  w.d = fp16_to_fp32(b.d);
  const __m128i table = _mm_loadu_si128(reinterpret_cast<const __m128i*>(iq::kvalues_iq4nl));
  const __m128i m4 = _mm_set1_epi8(0xF);
  for (int ib = 0; ib < 8; ++ib) {
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs + 16 * ib));
    _mm_store_si128(reinterpret_cast<__m128i*>(w.w + 32 * ib),
                    _mm_shuffle_epi8(table, _mm_and_si128(q, m4)));
    _mm_store_si128(reinterpret_cast<__m128i*>(w.w + 32 * ib + 16),
                    _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(q, 4), m4)));
    const int l = b.scales_l[ib / 2] >> (4 * (ib % 2)) & 0xF;
    w.sc[ib] = int16_t((l | ((b.scales_h >> (2 * ib)) & 3) << 4) - 32);
  }
}

template <class A>
A* units_of(A* panel) {
  return reinterpret_cast<A*>((reinterpret_cast<uintptr_t>(panel) + 31) & ~uintptr_t(31));
}

inline __m256i bcast4(const void* p) {  // 4 bytes in every i32 lane
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// 8 rows x 8 tokens x one unit (8 blocks of 32): each block's exact sum into the row's float
// lane s.
void micro_b32(const WUnit* w, const AUnit& a, __m256* acc) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int s = 0; s < 8; ++s) {
    __m256i c[kRows];
    for (int r = 0; r < kRows; ++r) c[r] = _mm256_setzero_si256();
    for (int k = 0; k < 8; ++k) {
      const int k4 = 8 * s + k;
      const __m256i av = _mm256_load_si256(reinterpret_cast<const __m256i*>(a.q[k4]));
      for (int r = 0; r < kRows; ++r) {
        const __m256i p = _mm256_maddubs_epi16(bcast4(w[r].a + 4 * k4),
                                               _mm256_sign_epi8(av, bcast4(w[r].w + 4 * k4)));
        c[r] = _mm256_add_epi32(c[r], _mm256_madd_epi16(p, ones));
      }
    }
    const __m256 yd = _mm256_load_ps(a.yd[s]);
    for (int r = 0; r < kRows; ++r) {
      const __m256 t = _mm256_mul_ps(_mm256_set1_ps(w[r].db[s]), yd);
      acc[8 * r + s] = _mm256_add_ps(acc[8 * r + s], _mm256_mul_ps(t, _mm256_cvtepi32_ps(c[r])));
    }
  }
}

// MXFP4: 4 rows x 8 tokens x one unit (8 blocks of 32): the codes (value + 12, <= 24) against the
// activations summed in 16 bits over 4 steps (2 x 24 x 127 x 4 < 32767), 12 x the block's
// activation sum taken off; each block's exact sum into the row's float lane s, as micro_b32.
void micro_mxfp4_4(const WUnit* w, const AUnit& a, __m256* acc) {
  constexpr int kR = 4;
  const __m256i ones = _mm256_set1_epi16(1);
#pragma GCC unroll 1
  for (int s = 0; s < 8; ++s) {
    __m256i c[kR];
    for (int r = 0; r < kR; ++r) c[r] = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      __m256i p[kR];
      for (int r = 0; r < kR; ++r) p[r] = _mm256_setzero_si256();
      for (int k = 4 * h; k < 4 * h + 4; ++k) {
        const int k4 = 8 * s + k;
        const __m256i av = _mm256_load_si256(reinterpret_cast<const __m256i*>(a.q[k4]));
        for (int r = 0; r < kR; ++r)
          p[r] = _mm256_add_epi16(p[r], _mm256_maddubs_epi16(bcast4(w[r].w + 4 * k4), av));
      }
      for (int r = 0; r < kR; ++r) c[r] = _mm256_add_epi32(c[r], _mm256_madd_epi16(p[r], ones));
    }
    const __m256i sb = _mm256_load_si256(reinterpret_cast<const __m256i*>(a.s_blk[s]));
    const __m256i bias = _mm256_add_epi32(_mm256_slli_epi32(sb, 3), _mm256_slli_epi32(sb, 2));
    const __m256 yd = _mm256_load_ps(a.yd[s]);
    for (int r = 0; r < kR; ++r) {
      const __m256 t = _mm256_mul_ps(_mm256_set1_ps(w[r].db[s]), yd);
      acc[8 * r + s] = _mm256_add_ps(
          acc[8 * r + s], _mm256_mul_ps(t, _mm256_cvtepi32_ps(_mm256_sub_epi32(c[r], bias))));
    }
  }
}

// 4 rows x 8 tokens x one super-block of sub-blocks of kSub: the exact integer sums I (scaled
// sub-block by sub-block) of each row, 8 tokens in i32 lanes. kSteps: the 4-element steps summed
// in 16 bits before the scale's vpmaddwd (Codes).
template <Form kForm, int kSub, int kSteps>
void micro_sb(const WUnit* w, const AUnit& a, __m256i* isum) {
  constexpr int kR = 4, kK = kSub / 4;
  for (int r = 0; r < kR; ++r) isum[r] = _mm256_setzero_si256();
#pragma GCC unroll 1
  for (int s = 0; s < kUnit / kSub; ++s) {
    __m256i sc[kR];
    for (int r = 0; r < kR; ++r) sc[r] = _mm256_set1_epi16(w[r].sc[s]);
    if constexpr (kForm == Form::Codes || (kForm == Form::Biased && kSteps > 1)) {
      for (int k0 = 0; k0 < kK; k0 += kSteps) {
        __m256i p[kR];
        for (int r = 0; r < kR; ++r) p[r] = _mm256_setzero_si256();
        for (int k = k0; k < k0 + kSteps; ++k) {
          const int k4 = kK * s + k;
          const __m256i av = _mm256_load_si256(reinterpret_cast<const __m256i*>(a.q[k4]));
          for (int r = 0; r < kR; ++r)
            p[r] = _mm256_add_epi16(p[r], kForm == Form::Codes
                                              ? _mm256_maddubs_epi16(bcast4(w[r].w + 4 * k4), av)
                                              : _mm256_maddubs_epi16(av, bcast4(w[r].w + 4 * k4)));
        }
        for (int r = 0; r < kR; ++r)
          isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(p[r], sc[r]));
      }
    } else {
      for (int k = 0; k < kK; ++k) {
        const int k4 = kK * s + k;
        const __m256i av = _mm256_load_si256(reinterpret_cast<const __m256i*>(a.q[k4]));
        const __m256i aa = kForm == Form::Signs ? _mm256_abs_epi8(av) : av;
        for (int r = 0; r < kR; ++r) {
          __m256i p;
          if constexpr (kForm == Form::Biased)
            p = _mm256_maddubs_epi16(av, bcast4(w[r].w + 4 * k4));
          else  // |q| against w with q's signs (|q|, |w| <= 127: no wrap, no saturation)
            p = _mm256_maddubs_epi16(aa, _mm256_sign_epi8(bcast4(w[r].w + 4 * k4), av));
          isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(p, sc[r]));
        }
      }
    }
  }
  if constexpr (kForm == Form::Biased)
    for (int r = 0; r < kR; ++r) isum[r] = _mm256_sub_epi32(isum[r], _mm256_set1_epi32(w[r].corr));
}

// 8 rows x 8 tokens x one super-block into the rows' float lane l (sb_lanes' arithmetic).
template <Form kForm, int kSub, int kSteps, bool kMins, bool kBias>
void micro_sb_lanes(const WUnit* w, const AUnit& a, int l, __m256* acc) {
  const __m256 yd = _mm256_load_ps(a.yd[0]);
  for (int r0 = 0; r0 < kRows; r0 += 4) {
    __m256i isum[4];
    micro_sb<kForm, kSub, kSteps>(w + r0, a, isum);
    for (int r = 0; r < 4; ++r) {
      const WUnit& wr = w[r0 + r];
      __m256i f = _mm256_setzero_si256();  // f2 against the activations' sub-block sums
      if constexpr (kMins || kBias) {
        const int16_t(*sums)[kLanes][2] = kSub == 32 ? a.s32 : a.s16;
        for (int j = 0; j < 256 / kSub / 2; ++j)
          f = _mm256_add_epi32(
              f, _mm256_madd_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(sums[j])),
                                   _mm256_set1_epi32(wr.f2[j])));
      }
      if constexpr (kBias) isum[r] = _mm256_sub_epi32(isum[r], f);
      __m256& lane = acc[8 * (r0 + r) + l];
      lane = _mm256_add_ps(lane, _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(wr.d), yd),
                                               _mm256_cvtepi32_ps(isum[r])));
      if constexpr (kMins)
        lane = _mm256_sub_ps(
            lane, _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(wr.dmin), yd), _mm256_cvtepi32_ps(f)));
    }
  }
}

using Unpack = void (*)(const uint8_t*, int64_t, WUnit&);
// A unit of 8 rows against one of 8 tokens, into the rows' float lanes (l: the super-block's).
using Micro = void (*)(const WUnit*, const AUnit&, int l, __m256* acc);
struct GemmType {
  uint32_t id;
  Unpack unpack;
  Form form;
  Micro micro;
  float post = 1.0f;  // the result's final factor (IQ2_XXS: 0.125)
};
// Codes' template arguments: the sub-block; the 4-element steps summed in 16 bits before the
// scale's vpmaddwd (no pair of them may pass 32767 with |q| <= 127: codes <= 15 take 8 steps,
// <= 31 4, <= 63 2); mins (a separate term scaled by dmin) or the codes' bias (off the integer
// sum), each f2 against the activations' sub-block sums.
const GemmType kGemmTypes[] = {
    {Q8_0, unpack_q8_0, Form::Block32,
     [](const WUnit* w, const AUnit& a, int, __m256* acc) { micro_b32(w, a, acc); }},
    {MXFP4, unpack_mxfp4, Form::Mxfp4,
     [](const WUnit* w, const AUnit& a, int, __m256* acc) {
       micro_mxfp4_4(w, a, acc);
       micro_mxfp4_4(w + 4, a, acc + 32);
     }},
    {Q4_K, unpack_k45<false>, Form::Codes, micro_sb_lanes<Form::Codes, 32, 8, true, false>},
    {Q5_K, unpack_k45<true>, Form::Codes, micro_sb_lanes<Form::Codes, 32, 4, true, false>},
    {Q2_K, unpack_q2_k, Form::Codes, micro_sb_lanes<Form::Codes, 16, 4, true, false>},
    {Q3_K, unpack_q3_k, Form::Codes, micro_sb_lanes<Form::Codes, 16, 4, false, true>},
    {Q6_K, unpack_q6_k, Form::Codes, micro_sb_lanes<Form::Codes, 16, 2, false, true>},
    {IQ2_XXS, unpack_iq2_xxs, Form::Biased, micro_sb_lanes<Form::Biased, 32, 1, false, false>,
     0.125f},
    {IQ4_XS, unpack_iq4_xs, Form::Signs, micro_sb_lanes<Form::Signs, 32, 1, false, false>},
    {IQ2_XS, unpack_grid<BlockIq2Xs>, Form::Biased,
     micro_sb_lanes<Form::Biased, 16, 1, false, false>, Grid<BlockIq2Xs>::kPost},
    {IQ2_S, unpack_grid<BlockIq2S>, Form::Biased, micro_sb_lanes<Form::Biased, 16, 1, false, false>,
     Grid<BlockIq2S>::kPost},
    {IQ3_XXS, unpack_grid<BlockIq3Xxs>, Form::Biased,
     micro_sb_lanes<Form::Biased, 32, 1, false, false>, Grid<BlockIq3Xxs>::kPost},
    {IQ3_S, unpack_grid<BlockIq3S>, Form::Biased, micro_sb_lanes<Form::Biased, 32, 1, false, false>,
     Grid<BlockIq3S>::kPost},
    // |v| <= 9: 4 steps of biased pairs, 4 x 2 x 255 x 9 < 2^15, in 16 bits
    {IQ1_S, unpack_iq1<BlockIq1S>, Form::Biased, micro_sb_lanes<Form::Biased, 32, 4, false, false>,
     0.125f},
    {IQ1_M, unpack_iq1<BlockIq1M>, Form::Biased, micro_sb_lanes<Form::Biased, 16, 4, false, false>,
     0.125f},
};
const GemmType* find(uint32_t wtype) {
  for (const GemmType& g : kGemmTypes)
    if (g.id == wtype) return &g;
  return nullptr;
}

// F16 and BF16 (gemm_float.h): the activations as avx2.cpp's dots widen them, F16's in order,
// BF16's each 16 elements' even ones (shifted left 16) then its odd ones (low halves cleared);
// one row against two tokens a pass, each (row, token) in the dot's four chains.
void float_lay_out(uint32_t wtype, const uint8_t* xq, size_t xq_row, const int32_t* tok,
                   int64_t n_tokens, int64_t cols, float* out) {
  const __m256i hi = _mm256_set1_epi32(int(0xFFFF0000u));
  for (int64_t i = 0; i < n_tokens; ++i) {
    const uint16_t* x = reinterpret_cast<const uint16_t*>(xq + (tok ? tok[i] : i) * xq_row);
    float* o = out + i * cols;
    for (int64_t j = 0; j < cols; j += 16)
      if (wtype == F16) {
        _mm256_storeu_ps(o + j,
                         _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + j))));
        _mm256_storeu_ps(
            o + j + 8,
            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + j + 8))));
      } else {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + j));
        _mm256_storeu_ps(o + j, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
        _mm256_storeu_ps(o + j + 8, _mm256_castsi256_ps(_mm256_and_si256(v, hi)));
      }
  }
}

template <uint32_t T, int N>
__attribute__((always_inline)) inline void float_pass(const uint16_t* w, int64_t cols,
                                                      const float* const* xs, float (*out)[2]) {
  const __m256i hi = _mm256_set1_epi32(int(0xFFFF0000u));
  __m256 acc[N][4];
  for (int t = 0; t < N; ++t)
    for (int k = 0; k < 4; ++k) acc[t][k] = _mm256_setzero_ps();
  for (int64_t j = 0; j < cols; j += 32) {
    __m256 wv[4];
    if constexpr (T == F16) {
      for (int k = 0; k < 4; ++k)
        wv[k] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + j + 8 * k)));
    } else {
      for (int c = 0; c < 2; ++c) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + j + 16 * c));
        wv[2 * c] = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
        wv[2 * c + 1] = _mm256_castsi256_ps(_mm256_and_si256(v, hi));
      }
    }
    for (int t = 0; t < N; ++t)
      for (int k = 0; k < 4; ++k)
        acc[t][k] = _mm256_fmadd_ps(wv[k], _mm256_loadu_ps(xs[t] + j + 8 * k), acc[t][k]);
  }
  for (int t = 0; t < N; ++t)
    out[0][t] = x86::hsum(
        _mm256_add_ps(_mm256_add_ps(acc[t][0], acc[t][1]), _mm256_add_ps(acc[t][2], acc[t][3])));
}

template <uint32_t T>
void float_rows(const void* w, int64_t rows, int64_t cols, int64_t r0, int64_t r1,
                const float* panel, int64_t n_tokens, float* y) {
  x86::float_rows<1, 2>(
      static_cast<const uint16_t*>(w), rows, cols, r0, r1, panel, n_tokens, y,
      [&](int, int nt, const uint16_t* wr, const float* const* xs, float(*out)[2]) {
        if (nt == 2)
          float_pass<T, 2>(wr, cols, xs, out);
        else
          float_pass<T, 1>(wr, cols, xs, out);
      });
}

}  // namespace

bool gemm_supported(uint32_t wtype) {
  return x86::float_panel_type(wtype) || find(wtype) != nullptr;
}

size_t gemm_act_bytes(uint32_t wtype, int64_t cols, int64_t n_tokens) {
  if (x86::float_panel_type(wtype)) return x86::float_panel_bytes(cols, n_tokens);
  return size_t((n_tokens + kLanes - 1) / kLanes) * size_t(cols / kUnit) * sizeof(AUnit) + 32;
}

void gemm_lay_out(uint32_t wtype, const uint8_t* xq, size_t xq_row, const int32_t* tok,
                  int64_t n_tokens, int64_t cols, uint8_t* panel) {
  if (x86::float_panel_type(wtype))
    return float_lay_out(wtype, xq, xq_row, tok, n_tokens, cols, x86::float_panel(panel));
  AUnit* out = units_of(reinterpret_cast<AUnit*>(panel));
  const int64_t units = cols / kUnit, groups = (n_tokens + kLanes - 1) / kLanes;
  const bool q8k = vec_dot_type(wtype) == Q8_K;
  const uint8_t bias = find(wtype)->form == Form::Biased ? 0x80 : 0;
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t u = 0; u < units; ++u) {
      AUnit& a = out[g * units + u];
      std::memset(&a, 0, sizeof a);
      if (bias) std::memset(a.q, bias, sizeof a.q);  // absent tokens: q = 0, biased
      for (int t = 0; t < kLanes && g * kLanes + t < n_tokens; ++t) {
        const int64_t i = g * kLanes + t;
        const uint8_t* x = xq + (tok ? tok[i] : i) * xq_row;
        if (q8k) {
          const BlockQ8K& b = reinterpret_cast<const BlockQ8K*>(x)[u];
          a.yd[0][t] = b.d;
          for (int j = 0; j < 4; ++j)
            for (int h = 0; h < 2; ++h)
              a.s32[j][t][h] = int16_t(b.bsums[4 * j + 2 * h] + b.bsums[4 * j + 2 * h + 1]);
          for (int j = 0; j < 8; ++j)
            for (int h = 0; h < 2; ++h) a.s16[j][t][h] = b.bsums[2 * j + h];
          for (int k4 = 0; k4 < kUnit / 4; ++k4)
            for (int e = 0; e < 4; ++e) a.q[k4][t][e] = int8_t(b.qs[4 * k4 + e] ^ bias);
        } else {
          const BlockQ8_0* b = reinterpret_cast<const BlockQ8_0*>(x) + 8 * u;
          for (int k = 0; k < 8; ++k) {
            a.yd[k][t] = fp16_to_fp32(b[k].d);
            int sum = 0;
            for (int e = 0; e < 32; ++e) sum += b[k].qs[e];
            a.s_blk[k][t] = sum;
            for (int k4 = 0; k4 < 8; ++k4) std::memcpy(a.q[8 * k + k4][t], b[k].qs + 4 * k4, 4);
          }
        }
      }
    }
}

void gemm_rows(uint32_t wtype, const void* w, int64_t rows, int64_t cols, int64_t r0, int64_t r1,
               const uint8_t* panel, int64_t n_tokens, float* y) {
  if (x86::float_panel_type(wtype)) {
    const float* x = x86::float_panel(panel);
    return wtype == F16 ? float_rows<F16>(w, rows, cols, r0, r1, x, n_tokens, y)
                        : float_rows<BF16>(w, rows, cols, r0, r1, x, n_tokens, y);
  }
  const GemmType& g = *find(wtype);
  const bool block32 = g.form == Form::Block32 || g.form == Form::Mxfp4;
  const int64_t units = cols / kUnit;
  const size_t w_row = row_size(wtype, cols);
  const AUnit* act = units_of(reinterpret_cast<const AUnit*>(panel));
  x86::drive_rows<kRows, kLanes, WUnit>(
      units, n_tokens, rows, r0, r1, static_cast<const uint8_t*>(w), w_row,
      [&](int64_t row, int64_t u, WUnit& wu) {
        g.unpack(static_cast<const uint8_t*>(w) + row * w_row, u, wu);
      },
      [](WUnit& wu) { std::memset(&wu, 0, sizeof wu); },
      [&](const WUnit* wp, int64_t gi, float(*out)[kLanes]) {
        __m256 acc[kRows * 8];  // 8 float lanes per row: block (or super-block) b in lane b % 8
        for (__m256& v : acc) v = _mm256_setzero_ps();
        for (int64_t u = 0; u < units; ++u)
          g.micro(&wp[size_t(u) * kRows], act[gi * units + u], block32 ? 0 : int(u % 8), acc);
        for (int r = 0; r < kRows; ++r) {  // hsum's order of the 8 lanes
          const __m256* a8 = acc + 8 * r;
          const __m256 v = _mm256_add_ps(
              _mm256_add_ps(_mm256_add_ps(a8[0], a8[4]), _mm256_add_ps(a8[2], a8[6])),
              _mm256_add_ps(_mm256_add_ps(a8[1], a8[5]), _mm256_add_ps(a8[3], a8[7])));
          _mm256_store_ps(out[r], g.post == 1.0f ? v : _mm256_mul_ps(_mm256_set1_ps(g.post), v));
        }
      },
      y);
}

}  // namespace kernels::avx2
