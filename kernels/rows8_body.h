// What the interleaved rows' bodies of both instruction sets share (rows8_avx2.cpp,
// rows8_avx512.cpp): the block loop with its prefetch, the rows' lane sums, and the shuffles that
// spread a sub-block pair's per-row bytes over the rows' lanes. Internal to kernels/; an unnamed
// namespace, so each file keeps its own copy, compiled with its own flags.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <utility>

#include "kernels/quant_blocks.h"

namespace kernels {
namespace {

inline __m256i bcast32(const void* p) {  // four bytes (activations, or two i16 sums) in every lane
  int32_t v;
  __builtin_memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
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

}  // namespace
}  // namespace kernels
