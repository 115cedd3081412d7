// What the interleaved rows' bodies of both instruction sets share (rows8_avx2.cpp,
// rows8_avx512.cpp): the block loop with its prefetch, the rows' lane sums, and the shuffles that
// spread a sub-block pair's per-row bytes over the rows' lanes. Internal to kernels/; an unnamed
// namespace, so each file keeps its own copy, compiled with its own flags.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "kernels/iq_grids.h"
#include "kernels/quant_blocks.h"
#include "kernels/rows8.h"
#include "kernels/types.h"

namespace kernels {
namespace {

inline __m256i bcast32(const void* p) {  // four bytes (activations, or two i16 sums) in every lane
  int32_t v;
  __builtin_memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

inline __m256i lane_total(__m256i v) {  // the eight i32 lanes' sum, in every lane
  v = _mm256_add_epi32(v, _mm256_permute2x128_si256(v, v, 1));
  v = _mm256_add_epi32(v, _mm256_shuffle_epi32(v, 0x4E));
  return _mm256_add_epi32(v, _mm256_shuffle_epi32(v, 0xB1));
}

// Row r's result in lane r: the eight lane accumulators added as x86::hsum adds one row's lanes,
// ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)).
inline __m256 sum_lanes(const __m256* a) {
  return _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[2], a[6])),
                       _mm256_add_ps(_mm256_add_ps(a[1], a[5]), _mm256_add_ps(a[3], a[7])));
}

// The loop every body runs: block by block, each prefetching the block kAhead on (~18 KiB: the
// stream runs on into the next group; the hardware's prefetcher alone leaves the product well short
// of the memory's bandwidth), body(b, block, acc) adding block b's sums into the tokens' lane
// accumulators acc[t][b % 8]; token t's row r into out[8t + r]. The distance: ~4.5 KiB as first
// tuned on an AMD EPYC; on an Intel Xeon (AVX-512 VNNI, 2 vCPUs) 4x that decoded 1.2x (Q4_K),
// 1.12x (MXFP4), 1.07-1.2x (Q2_K with Q3_K) on both instruction sets, and 8x no better. Into L2
// (T1), not L1: an L1 prefetch holds one of the core's few line-fill buffers until its line
// arrives, which capped a thread near 10 GB/s where the memory gave more; on the same Xeon, L2
// decoded 1.09-1.17x (Q4_K, Q2_K with Q3_K, MXFP4 experts; both instruction sets), and twice the
// distance then was no better.
template <int N, int kAhead, class Block, class Body>
__attribute__((always_inline)) inline void blocks(const Block* x, int64_t nb, float* out,
                                                  const Body& body) {
  __m256 acc[N][8];
  for (int t = 0; t < N; ++t)
    for (int l = 0; l < 8; ++l) acc[t][l] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    for (size_t o = 0; o < sizeof(Block); o += 64)
      _mm_prefetch(reinterpret_cast<const char*>(x + b + kAhead) + o, _MM_HINT_T1);
    body(b, x[b], acc);
  }
  for (int t = 0; t < N; ++t) _mm256_storeu_ps(out + 8 * t, sum_lanes(acc[t]));
}

// A super-block's exact sums into its rows' lanes, one row per lane (avx2.h's sb_lanes):
// acc = (acc + (d dy) I) - (dmin dy) M.
template <int N, bool kMins>
__attribute__((always_inline)) inline void sb_lane(const uint16_t* d, const uint16_t* dmin,
                                                   const BlockQ8K* const* ys, int64_t b,
                                                   const __m256i* I, const __m256i* M,
                                                   __m256 (*acc)[8]) {
  const __m256 dx = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(d)));
  const int l = int(b & 7);
  for (int t = 0; t < N; ++t) {
    const __m256 dy = _mm256_set1_ps(ys[t][b].d);
    __m256 r =
        _mm256_add_ps(acc[t][l], _mm256_mul_ps(_mm256_mul_ps(dx, dy), _mm256_cvtepi32_ps(I[t])));
    if constexpr (kMins) {
      const __m256 dmx = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(dmin)));
      r = _mm256_sub_ps(r, _mm256_mul_ps(_mm256_mul_ps(dmx, dy), _mm256_cvtepi32_ps(M[t])));
    }
    acc[t][l] = r;
  }
}

// Shuffles of a sub-block pair's 16 bytes v[2][8] ([sub-block][row], in both 128-bit halves) into
// the rows' lanes (row r in lane r; the low half holds rows 0-3, the high 4-7), zero elsewhere:
// kDup[k]: words (v[k][r], v[k][r]), a vpmaddwd multiplier of the row's i16 pairs;
// kZx[k]: v[k][r] in the lane's low byte (a vpdpwssd multiplier of an i32 that fits 16 bits);
// kPair: words (v[0][r], v[1][r]), against the activations' two 16-element sums.
struct PairShuffles {
  alignas(32) uint8_t dup[2][32], zx[2][32], pair[32];
};
constexpr PairShuffles make_pair_shuffles() {
  PairShuffles s{};
  for (int i = 0; i < 32; ++i) {
    const int r = i / 4 % 4 + 4 * (i / 16), byte = i % 4;  // row r's lane, byte of the lane
    for (int k = 0; k < 2; ++k) {
      s.dup[k][i] = uint8_t(byte % 2 == 0 ? 8 * k + r : 0x80);
      s.zx[k][i] = uint8_t(byte == 0 ? 8 * k + r : 0x80);
    }
    s.pair[i] = uint8_t(byte % 2 == 0 ? 8 * (byte / 2) + r : 0x80);
  }
  return s;
}
inline constexpr PairShuffles kPairShuffles = make_pair_shuffles();
inline __m256i shuffle_pair(__m256i v, const uint8_t* idx) {
  return _mm256_shuffle_epi8(v, _mm256_load_si256(reinterpret_cast<const __m256i*>(idx)));
}
inline __m256i load_pair(const void* v) {  // 16 bytes in both halves
  return _mm256_broadcastsi128_si256(_mm_loadu_si128(static_cast<const __m128i*>(v)));
}
// Signed bytes spread into i16 words (zero or one byte per word) sign-extended.
inline __m256i sign_words(__m256i v) {
  return _mm256_srai_epi16(_mm256_slli_epi16(v, 8), 8);
}

// f.template operator()<P>() for P = 0 .. 7: the sub-block pairs with compile-time shifts.
template <class F>
__attribute__((always_inline)) inline void each_pair(const F& f) {
  [&]<int... P>(std::integer_sequence<int, P...>) {
    (f.template operator()<P>(), ...);
  }
  (std::make_integer_sequence<int, 8>{});
}

// NVFP4's UE4M3 sub-block scales of eight rows (rows8.h's BlockNvfp4x8::d) as floats, exactly
// ue4m3_half's values: v[k] lane r = ue4m3_half(d[k][r]). Each byte becomes an fp16 with the
// same value, two bytes at a time, then four vcvtph2ps: (e, m) with e > 0 is 2^(e-8) (1 + m/8),
// the fp16 (e + 7, m << 7), whose high byte is (x >> 1) + 0x1C and low byte (x & 1) << 7; e = 0 is
// m 2^-10, whose fp16 high bytes (low bytes 0) a vpshufb looks up, each no more than the normal
// formula's (so a vpminub picks it, 0xFF elsewhere). 0x7F is 0; bit 7 is ignored, as there.
__attribute__((always_inline)) inline void nvfp4x8_scales(const uint8_t* d, __m256* v) {
  const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(d));
  const __m256i y = _mm256_andnot_si256(_mm256_cmpeq_epi8(x, _mm256_set1_epi8(0x7F)),
                                        _mm256_and_si256(x, _mm256_set1_epi8(0x7F)));
  const __m256i sub = _mm256_cmpgt_epi8(_mm256_set1_epi8(8), y);  // e = 0
  const __m256i sub_hi =
      _mm256_setr_epi8(0, 0x14, 0x18, 0x1A, 0x1C, 0x1D, 0x1E, 0x1F, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x14,
                       0x18, 0x1A, 0x1C, 0x1D, 0x1E, 0x1F, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m256i hi = _mm256_min_epu8(
      _mm256_add_epi8(_mm256_and_si256(_mm256_srli_epi16(y, 1), _mm256_set1_epi8(0x7F)),
                      _mm256_set1_epi8(0x1C)),
      _mm256_or_si256(_mm256_shuffle_epi8(sub_hi, y),
                      _mm256_andnot_si256(sub, _mm256_set1_epi8(-1))));
  const __m256i lo = _mm256_andnot_si256(
      sub, _mm256_and_si256(_mm256_slli_epi16(y, 7), _mm256_set1_epi8(static_cast<char>(0x80))));
  const __m256i h02 = _mm256_unpacklo_epi8(lo, hi), h13 = _mm256_unpackhi_epi8(lo, hi);
  v[0] = _mm256_cvtph_ps(_mm256_castsi256_si128(h02));
  v[1] = _mm256_cvtph_ps(_mm256_castsi256_si128(h13));
  v[2] = _mm256_cvtph_ps(_mm256_extracti128_si256(h02, 1));
  v[3] = _mm256_cvtph_ps(_mm256_extracti128_si256(h13, 1));
}

// NVFP4: x86.h's nvfp4_rows, one row per lane. Its float lane 2k + p is sub-block k's half p
// (elements 8p ..) of every block: here the accumulator acc[t][2k + p], fed the same exact
// 8-element sums (|w| against the activations given w's signs; Dot::dot2 sums two steps' four bytes
// a lane) times the same products of scales, and summed as hsum sums the lanes there.
template <class Dot, int N>
__attribute__((always_inline)) inline void nvfp4_group(const BlockNvfp4x8* x, int64_t nb,
                                                       const BlockQ8_0* const* ys, float* out) {
  const __m256i table =
      _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kMxfp4Doubled)));
  const __m256i m4 = _mm256_set1_epi8(0xF);
  blocks<N, 64>(x, nb, out, [&](int64_t b, const BlockNvfp4x8& w, __m256(*acc)[8]) {
    __m256 v[4];
    nvfp4x8_scales(&w.d[0][0], v);
    __m256 dy[N][2];
    for (int t = 0; t < N; ++t)
      for (int h = 0; h < 2; ++h) dy[t][h] = _mm256_set1_ps(_cvtsh_ss(ys[t][2 * b + h].d));
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      __m256i lo[2], hi[2];  // step 2k + i's low and high nibbles' values
      for (int i = 0; i < 2; ++i) {
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.qs[2 * k + i]));
        lo[i] = _mm256_shuffle_epi8(table, _mm256_and_si256(q, m4));
        hi[i] = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(q, 4), m4));
      }
      const __m256i alo0 = _mm256_abs_epi8(lo[0]), alo1 = _mm256_abs_epi8(lo[1]);
      const __m256i ahi0 = _mm256_abs_epi8(hi[0]), ahi1 = _mm256_abs_epi8(hi[1]);
      for (int t = 0; t < N; ++t) {
        const int8_t* a = ys[t][2 * b + k / 2].qs + 16 * (k % 2);
        const __m256i p0 = Dot::dot2(alo0, _mm256_sign_epi8(bcast32(a), lo[0]), alo1,
                                     _mm256_sign_epi8(bcast32(a + 4), lo[1]));
        const __m256i p1 = Dot::dot2(ahi0, _mm256_sign_epi8(bcast32(a + 8), hi[0]), ahi1,
                                     _mm256_sign_epi8(bcast32(a + 12), hi[1]));
        const __m256 sc = _mm256_mul_ps(v[k], dy[t][k / 2]);
        acc[t][2 * k] = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(p0), acc[t][2 * k]);
        acc[t][2 * k + 1] = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(p1), acc[t][2 * k + 1]);
      }
    }
  });
}

// Lanes' i32 sums in every lane: v's eight added.
inline __m256i spread_total(__m256i v) {
  v = _mm256_add_epi32(v, _mm256_permute2x128_si256(v, v, 1));
  v = _mm256_add_epi32(v, _mm256_shuffle_epi32(v, 0x4E));
  return _mm256_add_epi32(v, _mm256_shuffle_epi32(v, 0xB1));
}

// Q2_0 (rows8.h's BlockQ2_0x8) in the rows' dot's order, the reference's (one row per lane):
// each Q8_0 block's exact sum, sum_i = dy0 I0 + dy1 I1 over the block's two, s += d sum_i; in
// acc[t][0], the other lanes +0 (sum_lanes then adds nothing that changes a bit). A step's field f
// (codes 0..3) against its four activations, Dot::sum8 adding a Q8_0 block's eight such sums; the
// offset (q - 1) comes off as the block's activation sum (Dot::total, in every lane).
template <class Dot, int N>
__attribute__((always_inline)) inline void q2_0_group(const BlockQ2_0x8* x, int64_t nb,
                                                      const BlockQ8_0* const* ys, float* out) {
  const __m256i m2 = _mm256_set1_epi8(3);
  blocks<N, 128>(x, nb, out, [&](int64_t b, const BlockQ2_0x8& w, __m256(*acc)[8]) {
    const __m256 dx = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.d)));
    __m256 sum[N];
    for (int t = 0; t < N; ++t) sum[t] = _mm256_setzero_ps();
#pragma GCC unroll 2
    for (int k = 0; k < 2; ++k) {
      __m256i u[8];  // steps 2k and 2k + 1, fields 0..3: elements 4j .. 4j + 3 of the Q8_0 block
      for (int i = 0; i < 2; ++i) {
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.qs[2 * k + i]));
        for (int f = 0; f < 4; ++f)
          u[4 * i + f] = _mm256_and_si256(f ? _mm256_srli_epi16(q, 2 * f) : q, m2);
      }
      for (int t = 0; t < N; ++t) {
        const BlockQ8_0& y = ys[t][2 * b + k];
        __m256i a[8];
        for (int j = 0; j < 8; ++j) a[j] = bcast32(y.qs + 4 * j);
        const __m256i I = _mm256_sub_epi32(
            Dot::sum8(u, a),
            spread_total(Dot::sums4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(y.qs)))));
        const __m256 dy = _mm256_set1_ps(_cvtsh_ss(y.d));
        sum[t] = _mm256_add_ps(sum[t], _mm256_mul_ps(dy, _mm256_cvtepi32_ps(I)));
      }
    }
    for (int t = 0; t < N; ++t) acc[t][0] = _mm256_add_ps(acc[t][0], _mm256_mul_ps(dx, sum[t]));
  });
}

// Where a step's fifth bits are (BlockB32x8's qh, a u32 per row, bit j element j's): step s's
// low nibbles are elements 4s.., bits 4(s % 2).. of byte s / 2; its high ones byte 2 + s / 2.
// kFifthBytes[k] puts byte k of each lane in all four of the lane's bytes; kFifthBits[n] picks bit
// 4n + i of the lane's byte i.
struct FifthBits {
  alignas(32) uint8_t bytes[4][32], bits[2][32];
};
constexpr FifthBits make_fifth_bits() {
  FifthBits f{};
  for (int i = 0; i < 32; ++i) {
    for (int k = 0; k < 4; ++k) f.bytes[k][i] = uint8_t(i % 16 / 4 * 4 + k);
    for (int n = 0; n < 2; ++n) f.bits[n][i] = uint8_t(1 << (4 * n + i % 4));
  }
  return f;
}
inline constexpr FifthBits kFifth = make_fifth_bits();

// The legacy 32-element blocks and IQ4_NL (rows8.h's BlockB32x8). A step's low nibbles are
// elements 4s.. of each row and its high ones 16 + 4s.., so its two exact 4-element sums per row
// are lanes s and 4 + s of the rows' dot (avx2_quants.cpp's mul_sum_i8 / madd_u8 sums). Q4_0, Q5_0
// and Q4_1, whose dots keep eight float lanes (an FMA a block into each), keep them in acc[t][s]
// and acc[t][4 + s], one row per lane, and sum_lanes adds them as the dot's hsum does (Q4_1's
// m x s terms summed apart and added last, as its dot does); IQ4_NL and Q5_1, whose dots add each
// block's exact sum in the reference's order, add it into acc[t][0] (the other lanes stay +0, and
// adding +0 to a sum that started at +0 changes no bit). Every code is summed unsigned against the
// activations (Ops::code_sums(u, a): each lane's four u x a); the signed types' offset (Q4_0's 8,
// Q5_0's 16, 128 on a biased IQ4_NL table) comes off as offset x the step's four activations,
// Ops::code_sums(offset, y) once a block and token for all eight steps (lane s holds step s's:
// the same lanes as the rows' sums), each step's broadcast from memory. Each instruction set its
// own way, the same bytes and integers: Ops::add_fifth(v, qh, byte, nibble), v with 16 added where
// bit 4 nibble + i of qh's byte `byte` is set (kFifth; Q5_0, Q5_1); Ops::kBiasedTable, IQ4_NL's
// values + 128 summed unsigned (else |w| against the activations with w's signs).
template <class Ops, int N, uint32_t T>
__attribute__((always_inline)) inline void b32_group(const void* group, int64_t nb,
                                                     const void* const* yv, float* out) {
  constexpr bool kMin = T == Q4_1 || T == Q5_1, kFive = T == Q5_0 || T == Q5_1;
  constexpr bool kLanes = T == Q4_0 || T == Q5_0 || T == Q4_1;
  using Block8 = BlockB32x8<kMin, kFive>;
  using Act = std::conditional_t<kMin, BlockQ8_1, BlockQ8_0>;
  const auto* x = static_cast<const Block8*>(group);
  const auto* const* ys = reinterpret_cast<const Act* const*>(yv);
  const __m256i low4 = _mm256_set1_epi8(0xF), ones16 = _mm256_set1_epi16(1);
  constexpr bool kBiased = T == IQ4_NL && Ops::kBiasedTable;
  constexpr bool kOffset = T == Q4_0 || T == Q5_0 || kBiased;
  const __m256i offset = _mm256_set1_epi8(static_cast<char>(kBiased ? 128 : kFive ? 16 : 8));
  __m256i table = _mm256_broadcastsi128_si256(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(iq::kvalues_iq4nl)));
  if constexpr (kBiased) table = _mm256_add_epi8(table, offset);
  __m256 mins[N];  // Q4_1: the m x s terms
  for (int t = 0; t < N; ++t) mins[t] = _mm256_setzero_ps();
  [[maybe_unused]] alignas(32) int32_t off[N][8];  // lane s: offset x step s's four activations
  blocks<N, 18432 / sizeof(Block8)>(x, nb, out, [&](int64_t b, const Block8& w, __m256(*acc)[8]) {
    const __m256 dx = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.d)));
    __m256 dd[N];
    __m256i I[N];
    for (int t = 0; t < N; ++t) {
      dd[t] = _mm256_mul_ps(dx, _mm256_cvtph_ps(_mm_set1_epi16(static_cast<short>(ys[t][b].d))));
      I[t] = _mm256_setzero_si256();
      if constexpr (kOffset) {
        const __m256i o = Ops::code_sums(
            offset, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ys[t][b].qs)));
        if constexpr (kBiased)  // one sum a block: it starts less the offset's
          I[t] = _mm256_sub_epi32(I[t], lane_total(o));
        else
          _mm256_store_si256(reinterpret_cast<__m256i*>(off[t]), o);
      }
    }
    __m256i qh = _mm256_setzero_si256();
    if constexpr (kFive) qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.qh));
#pragma GCC unroll 4
    for (int s = 0; s < 4; ++s) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.qs[s]));
      __m256i lo = _mm256_and_si256(q, low4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
      if constexpr (kFive) {
        lo = Ops::add_fifth(lo, qh, s / 2, s % 2);
        hi = Ops::add_fifth(hi, qh, 2 + s / 2, s % 2);
      }
      if constexpr (T == IQ4_NL)
        lo = _mm256_shuffle_epi8(table, lo), hi = _mm256_shuffle_epi8(table, hi);
      for (int t = 0; t < N; ++t) {
        const int8_t* a = ys[t][b].qs + 4 * s;
        if constexpr (T == IQ4_NL && !kBiased) {  // |w| against the activations with w's signs
          const __m256i il = _mm256_madd_epi16(
              _mm256_maddubs_epi16(_mm256_abs_epi8(lo), _mm256_sign_epi8(bcast32(a), lo)), ones16);
          const __m256i ih = _mm256_madd_epi16(
              _mm256_maddubs_epi16(_mm256_abs_epi8(hi), _mm256_sign_epi8(bcast32(a + 16), hi)),
              ones16);
          I[t] = _mm256_add_epi32(I[t], _mm256_add_epi32(il, ih));
        } else if constexpr (!kLanes) {  // into the block's sum, which starts at -offset x a
          I[t] = Ops::code_sums(I[t], lo, bcast32(a));
          I[t] = Ops::code_sums(I[t], hi, bcast32(a + 16));
        } else {  // each step's sums into its float lanes, less the offset's
          __m256i il = Ops::code_sums(lo, bcast32(a)), ih = Ops::code_sums(hi, bcast32(a + 16));
          if constexpr (kOffset) {
            il = _mm256_sub_epi32(il, _mm256_set1_epi32(off[t][s]));
            ih = _mm256_sub_epi32(ih, _mm256_set1_epi32(off[t][4 + s]));
          }
          acc[t][s] = _mm256_fmadd_ps(dd[t], _mm256_cvtepi32_ps(il), acc[t][s]);
          acc[t][4 + s] = _mm256_fmadd_ps(dd[t], _mm256_cvtepi32_ps(ih), acc[t][4 + s]);
        }
      }
    }
    if constexpr (kMin) {
      const __m256 mx = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.m)));
      for (int t = 0; t < N; ++t) {
        const __m256 ms =
            _mm256_mul_ps(mx, _mm256_cvtph_ps(_mm_set1_epi16(static_cast<short>(ys[t][b].s))));
        if constexpr (T == Q4_1)
          mins[t] = _mm256_add_ps(mins[t], ms);
        else  // Q5_1: (d dy) I + m s, then into the sum
          acc[t][0] = _mm256_add_ps(
              acc[t][0], _mm256_add_ps(_mm256_mul_ps(dd[t], _mm256_cvtepi32_ps(I[t])), ms));
      }
    } else if constexpr (!kLanes) {  // IQ4_NL
      for (int t = 0; t < N; ++t)
        acc[t][0] = _mm256_add_ps(acc[t][0], _mm256_mul_ps(dd[t], _mm256_cvtepi32_ps(I[t])));
    }
  });
  if constexpr (T == Q4_1)
    for (int t = 0; t < N; ++t)
      _mm256_storeu_ps(out + 8 * t, _mm256_add_ps(_mm256_loadu_ps(out + 8 * t), mins[t]));
}

// b32_group of the type wtype names (Q4_0, Q4_1, Q5_0, Q5_1, else IQ4_NL), nb blocks a row.
template <class Ops, int N>
void b32_rows(uint32_t wtype, const void* group, int64_t nb, const void* const* ys, float* out) {
  switch (wtype) {
    case Q4_0:
      return b32_group<Ops, N, Q4_0>(group, nb, ys, out);
    case Q4_1:
      return b32_group<Ops, N, Q4_1>(group, nb, ys, out);
    case Q5_0:
      return b32_group<Ops, N, Q5_0>(group, nb, ys, out);
    case Q5_1:
      return b32_group<Ops, N, Q5_1>(group, nb, ys, out);
    default:
      return b32_group<Ops, N, IQ4_NL>(group, nb, ys, out);
  }
}

}  // namespace
}  // namespace kernels
