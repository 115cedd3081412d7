// The interleaved rows' matrix-vector bodies (rows8.h), AVX2; the AVX-512 build runs them too
// (eight rows fill a 256-bit register, and AMD's Zen 4 runs 512-bit ones as two halves).
#include <immintrin.h>

#include <type_traits>

#include "kernels/rows8.h"
#include "kernels/rows8_body.h"
#include "kernels/types.h"
#include "kernels/x86.h"

namespace kernels::avx2 {

namespace {

// Eight u8 values as i16 words (v0, v0, v1, v1, ..): a madd multiplier of lane r by v[r].
inline __m256i dup_words(const uint8_t* v) {
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(v));
  return _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(b, b));
}

// Q4_K and Q5_K (kFive: each code's fifth bit from qh, so codes up to 31, and the 16-bit sums
// hold 4 steps of pairs, <= 2 * 31 * 128 * 4 < 2^15, before they go to I; Q4_K's hold all 8).
template <int N, bool kFive, class Block8>
void k45_group(const Block8* x, int64_t nb, const BlockQ8K* const* ys, float* out) {
  const __m256i low4 = _mm256_set1_epi8(0xF), bit4 = _mm256_set1_epi8(0x10);
  constexpr int kSteps = kFive ? 4 : 8;
  blocks<N, 16>(x, nb, out, [&](int64_t b, const Block8& w, __m256(*acc)[8]) {
    __m256i I[N], M[N];
    alignas(16) int32_t bs[N][4];  // the activations' 32-element sums as i16 pairs (2p, 2p + 1)
    for (int t = 0; t < N; ++t) {
      const __m128i* s = reinterpret_cast<const __m128i*>(ys[t][b].bsums);
      _mm_store_si128(reinterpret_cast<__m128i*>(bs[t]),
                      _mm_hadd_epi16(_mm_loadu_si128(s), _mm_loadu_si128(s + 1)));
      I[t] = M[t] = _mm256_setzero_si256();
    }
#pragma GCC unroll 1
    for (int p = 0; p < 4; ++p) {
      const __m256i mins =
          _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.mins[p])));
      for (int t = 0; t < N; ++t)
        M[t] = _mm256_add_epi32(M[t], _mm256_madd_epi16(mins, _mm256_set1_epi32(bs[t][p])));
      const __m256i sl = dup_words(w.scales[2 * p]), sh = dup_words(w.scales[2 * p + 1]);
      const __m128i hshift = _mm_cvtsi32_si128(2 * p);  // qh's bits 2p, 2p + 1 to bits 0, 1
      for (int h = 0; h < 8; h += kSteps) {
        __m256i lo_sum[N], hi_sum[N];  // i16: Q4_K's 8 steps of pairs <= 2 * 15 * 128 < 2^15
        for (int t = 0; t < N; ++t) lo_sum[t] = hi_sum[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int s = h; s < h + kSteps; ++s) {
          const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.qs[p][s]));
          __m256i lo = _mm256_and_si256(q, low4);
          __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
          if constexpr (kFive) {
            const __m256i qh = _mm256_srl_epi16(
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.qh[s])), hshift);
            lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(qh, 4), bit4));
            hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(qh, 3), bit4));
          }
          for (int t = 0; t < N; ++t) {
            const int8_t* a = ys[t][b].qs + 64 * p + 4 * s;
            lo_sum[t] = _mm256_add_epi16(lo_sum[t], _mm256_maddubs_epi16(lo, bcast32(a)));
            hi_sum[t] = _mm256_add_epi16(hi_sum[t], _mm256_maddubs_epi16(hi, bcast32(a + 32)));
          }
        }
        for (int t = 0; t < N; ++t)
          I[t] = _mm256_add_epi32(I[t], _mm256_add_epi32(_mm256_madd_epi16(lo_sum[t], sl),
                                                         _mm256_madd_epi16(hi_sum[t], sh)));
      }
    }
    const __m256 dx = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.d)));
    const __m256 dmx = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.dmin)));
    const int l = int(b & 7);
    for (int t = 0; t < N; ++t) {  // avx2.h's sb_lanes, one row per lane
      const __m256 dy = _mm256_set1_ps(ys[t][b].d);
      const __m256 r =
          _mm256_add_ps(acc[t][l], _mm256_mul_ps(_mm256_mul_ps(dx, dy), _mm256_cvtepi32_ps(I[t])));
      acc[t][l] = _mm256_sub_ps(r, _mm256_mul_ps(_mm256_mul_ps(dmx, dy), _mm256_cvtepi32_ps(M[t])));
    }
  });
}

// Q2_K and Q3_K, sub-block pair P (h = P / 4, shift j = P % 4: elements 128h + 32j ..; steps 0-3
// are sub-block 2P, 4-7 sub-block 2P + 1): the codes of each step, 0..3 (Q2_K) or 0..7 with the
// high bit (Q3_K), against the activations summed in 16 bits (4 steps of pairs <= 2 * 7 * 128 <
// 2^15), then times the rows' sub-block scales (kDup words) into I.
template <int N, bool kHigh, int P, class Block>
__attribute__((always_inline)) inline void two_bit_pair(const Block& w, __m256i s_lo, __m256i s_hi,
                                                        const BlockQ8K* const* ys, int64_t b,
                                                        __m256i* I) {
  constexpr int h = P / 4, j = P % 4, k = 4 * h + j;
  const __m256i m3 = _mm256_set1_epi8(3), m4 = _mm256_set1_epi8(4);
  __m256i lo[N], hi[N];
  for (int t = 0; t < N; ++t) lo[t] = hi[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
  for (int s = 0; s < 8; ++s) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.qs[h][s]));
    __m256i u = _mm256_and_si256(j ? _mm256_srli_epi16(q, 2 * j) : q, m3);
    if constexpr (kHigh) {  // hmask bit k of each byte, moved to bit 2
      const __m256i hm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.hmask[s]));
      __m256i hb = hm;
      if constexpr (k > 2) hb = _mm256_srli_epi16(hm, k - 2);
      if constexpr (k < 2) hb = _mm256_slli_epi16(hm, 2 - k);
      u = _mm256_or_si256(u, _mm256_and_si256(hb, m4));
    }
    for (int t = 0; t < N; ++t) {
      const __m256i d = _mm256_maddubs_epi16(u, bcast32(ys[t][b].qs + 128 * h + 32 * j + 4 * s));
      if (s < 4)
        lo[t] = _mm256_add_epi16(lo[t], d);
      else
        hi[t] = _mm256_add_epi16(hi[t], d);
    }
  }
  for (int t = 0; t < N; ++t)
    I[t] = _mm256_add_epi32(
        I[t], _mm256_add_epi32(_mm256_madd_epi16(lo[t], s_lo), _mm256_madd_epi16(hi[t], s_hi)));
}

// Q2_K: codes 0..3 times the sub-block scales, less the mins against the activations' 16-element
// sums (the row dot's sums, avx2_quants.cpp).
template <int N>
void q2_k_group(const BlockQ2Kx8* x, int64_t nb, const BlockQ8K* const* ys, float* out) {
  const __m256i low4 = _mm256_set1_epi8(0xF);
  const PairShuffles& sh = kPairShuffles;
  blocks<N, 32>(x, nb, out, [&](int64_t b, const BlockQ2Kx8& w, __m256(*acc)[8]) {
    __m256i I[N], M[N];
    for (int t = 0; t < N; ++t) I[t] = M[t] = _mm256_setzero_si256();
    each_pair([&]<int P>() {
      const __m256i v = load_pair(w.scales[2 * P]);
      const __m256i mins = _mm256_srli_epi16(shuffle_pair(v, sh.pair), 4);
      for (int t = 0; t < N; ++t)
        M[t] = _mm256_add_epi32(M[t], _mm256_madd_epi16(mins, bcast32(ys[t][b].bsums + 2 * P)));
      two_bit_pair<N, false, P>(w, _mm256_and_si256(shuffle_pair(v, sh.dup[0]), low4),
                                _mm256_and_si256(shuffle_pair(v, sh.dup[1]), low4), ys, b, I);
    });
    sb_lane<N, true>(w.d, w.dmin, ys, b, I, M, acc);
  });
}

// Q3_K: u = code | high bit << 2 (0..7) times the sub-block scales, less 4 x the scales against the
// activations' 16-element sums (the row dot's sums).
template <int N>
void q3_k_group(const BlockQ3Kx8* x, int64_t nb, const BlockQ8K* const* ys, float* out) {
  const PairShuffles& sh = kPairShuffles;
  blocks<N, 24>(x, nb, out, [&](int64_t b, const BlockQ3Kx8& w, __m256(*acc)[8]) {
    __m256i I[N], B[N];
    for (int t = 0; t < N; ++t) I[t] = B[t] = _mm256_setzero_si256();
    each_pair([&]<int P>() {
      const __m256i v = load_pair(w.scales[2 * P]);
      const __m256i sc = sign_words(shuffle_pair(v, sh.pair));
      for (int t = 0; t < N; ++t)
        B[t] = _mm256_add_epi32(B[t], _mm256_madd_epi16(sc, bcast32(ys[t][b].bsums + 2 * P)));
      two_bit_pair<N, true, P>(w, sign_words(shuffle_pair(v, sh.dup[0])),
                               sign_words(shuffle_pair(v, sh.dup[1])), ys, b, I);
    });
    for (int t = 0; t < N; ++t) I[t] = _mm256_sub_epi32(I[t], _mm256_slli_epi32(B[t], 2));
    sb_lane<N, false>(w.d, nullptr, ys, b, I, nullptr, acc);
  });
}

// MXFP4: the doubled values + 12 (0..24) as unsigned codes against the activations, summed in
// 16 bits over half a block (4 steps of pairs <= 2 * 24 * 128), 12 x the block's activation sum
// taken off: each block's exact sum, then x86::b32_step's arithmetic, one row per lane.
template <int N>
void mxfp4_group(const BlockMxfp4x8* x, int64_t nb, const BlockQ8_0* const* ys, float* out) {
  const __m256i low4 = _mm256_set1_epi8(0xF), ones16 = _mm256_set1_epi16(1);
  const __m256i twelve = _mm256_set1_epi8(12);
  const __m256i table = _mm256_add_epi8(
      _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kMxfp4Doubled))),
      _mm256_set1_epi8(12));
  blocks<N, 128>(x, nb, out, [&](int64_t b, const BlockMxfp4x8& w, __m256(*acc)[8]) {
    __m256i lo_sum[N], hi_sum[N];
    for (int t = 0; t < N; ++t) lo_sum[t] = hi_sum[t] = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int s = 0; s < 4; ++s) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.qs[s]));
      const __m256i lo = _mm256_shuffle_epi8(table, _mm256_and_si256(q, low4));
      const __m256i hi =
          _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(q, 4), low4));
      for (int t = 0; t < N; ++t) {
        const int8_t* a = ys[t][b].qs + 4 * s;
        lo_sum[t] = _mm256_add_epi16(lo_sum[t], _mm256_maddubs_epi16(lo, bcast32(a)));
        hi_sum[t] = _mm256_add_epi16(hi_sum[t], _mm256_maddubs_epi16(hi, bcast32(a + 16)));
      }
    }
    // The rows' scales: e8m0_half of each exponent (x86::Mxfp4Values::scales).
    const __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w.e)));
    const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    const __m256i sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    const __m256 dx = _mm256_castsi256_ps(
        _mm256_blendv_epi8(sub, normal, _mm256_cmpgt_epi32(e, _mm256_set1_epi32(1))));
    const int l = int(b & 7);
    for (int t = 0; t < N; ++t) {
      // 12 x the activations' sum over the block, in every lane.
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ys[t][b].qs));
      __m256i bias = _mm256_madd_epi16(_mm256_maddubs_epi16(twelve, a), ones16);
      bias = _mm256_hadd_epi32(bias, bias);
      bias = _mm256_hadd_epi32(bias, bias);
      bias = _mm256_add_epi32(bias, _mm256_permute2x128_si256(bias, bias, 1));
      const __m256i I = _mm256_sub_epi32(_mm256_add_epi32(_mm256_madd_epi16(lo_sum[t], ones16),
                                                          _mm256_madd_epi16(hi_sum[t], ones16)),
                                         bias);
      const __m256 dy = _mm256_cvtph_ps(_mm_set1_epi16(static_cast<short>(ys[t][b].d)));
      acc[t][l] =
          _mm256_add_ps(acc[t][l], _mm256_mul_ps(_mm256_mul_ps(dx, dy), _mm256_cvtepi32_ps(I)));
    }
  });
}

// NVFP4 (rows8_body.h's nvfp4_group): two steps' products added in 16 bits (each <= 2 x 12 x 128),
// then in pairs into i32.
struct NvfpMaddubs {
  static __m256i dot2(__m256i u0, __m256i s0, __m256i u1, __m256i s1) {
    return _mm256_madd_epi16(
        _mm256_add_epi16(_mm256_maddubs_epi16(u0, s0), _mm256_maddubs_epi16(u1, s1)),
        _mm256_set1_epi16(1));
  }
};

// Q1_0 (rows8.h's BlockQ1_0x8) in the rows' dot's order (dot_q1_0's, llama.cpp's: lane l of a
// Q8_0 block is its elements 4l .. 4l + 3, blk = dy0 S0 then fma(dy_k, S_k, blk) over the block's
// four, acc = fma(d, blk, acc), the lanes summed as x86::hsum does). A register holds four rows'
// two lanes 2p, 2p + 1 (row 4h + j / 2, lane 2p + j % 2 in its lane j): their 32 bits of byte 4k +
// p as bytes, 0xFF where a bit is 0, the eight activations broadcast and negated there
// ((y ^ m) - m), summed by vpmaddubsw and vpmaddwd: the dot's integers.
template <int N>
void q1_0_rows8(const BlockQ1_0x8* x, int64_t nb, const BlockQ8_0* const* ys, float* out) {
  const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
  __m256 acc[N][4][2];
  for (int t = 0; t < N; ++t)
    for (int p = 0; p < 4; ++p) acc[t][p][0] = acc[t][p][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    for (size_t o = 0; o < sizeof(BlockQ1_0x8); o += 64)
      _mm_prefetch(reinterpret_cast<const char*>(x + b + 128) + o, _MM_HINT_T1);
    const BlockQ1_0x8& w = x[b];
    const __m256 d8 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.d)));
    const __m256 dx[2] = {_mm256_permutevar8x32_ps(d8, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3)),
                          _mm256_permutevar8x32_ps(d8, _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7))};
    __m256 dy[N][4];
    for (int t = 0; t < N; ++t)
      for (int k = 0; k < 4; ++k) dy[t][k] = _mm256_set1_ps(_cvtsh_ss(ys[t][4 * b + k].d));
    for (int p = 0; p < 4; ++p)
      for (int h = 0; h < 2; ++h) {
        __m256 blk[N];
        for (int k = 0; k < 4; ++k) {
          uint32_t word;
          std::memcpy(&word, &w.qs[4 * k + p][4 * h], 4);
          const __m256i zero_bit = x86::bytes_where_clear(word);
          for (int t = 0; t < N; ++t) {
            int64_t y8;
            std::memcpy(&y8, ys[t][4 * b + k].qs + 8 * p, 8);
            const __m256i y = _mm256_set1_epi64x(y8);
            const __m256i sy = _mm256_sub_epi8(_mm256_xor_si256(y, zero_bit), zero_bit);
            const __m256 s =
                _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(ones8, sy), ones16));
            blk[t] = k == 0 ? _mm256_mul_ps(dy[t][k], s) : _mm256_fmadd_ps(dy[t][k], s, blk[t]);
          }
        }
        for (int t = 0; t < N; ++t) acc[t][p][h] = _mm256_fmadd_ps(dx[h], blk[t], acc[t][p][h]);
      }
  }
  // Row 4h + r: ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)), a_2p + e in lane 2r + e of p.
  const __m256i even_odd = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
  for (int t = 0; t < N; ++t)
    for (int h = 0; h < 2; ++h) {
      const __m256 e =
          _mm256_permutevar8x32_ps(_mm256_add_ps(_mm256_add_ps(acc[t][0][h], acc[t][2][h]),
                                                 _mm256_add_ps(acc[t][1][h], acc[t][3][h])),
                                   even_odd);
      _mm_storeu_ps(out + 8 * t + 4 * h,
                    _mm_add_ps(_mm256_castps256_ps128(e), _mm256_extractf128_ps(e, 1)));
    }
}

// TQ2_0 (rows8.h's BlockTq2_0x8) in the row dot's order (avx2_quants.cpp's dot_tq2_0, llama.cpp's):
// row r's lane s of a super-block is the products of its step s of both halves, all four codes,
// less the activations' 16-element sums 2s and 2s + 1, so step s's register holds lane s of the
// eight rows: the eight vpmaddubsw of a lane summed in 16 bits (<= 8 x 2 x 3 x 128), the block
// sums' pair taken off there, vpmaddwd into i32, then acc[s] = float(lane) * (dy * dx) + acc[s].
template <int N>
void tq2_0_group(const BlockTq2_0x8* x, int64_t nb, const BlockQ8K* const* ys, float* out) {
  const __m256i m3 = _mm256_set1_epi8(3), ones16 = _mm256_set1_epi16(1);
  blocks<N, 32>(x, nb, out, [&](int64_t b, const BlockTq2_0x8& w, __m256(*acc)[8]) {
    const __m256 dx = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.d)));
    __m256 d[N];
    for (int t = 0; t < N; ++t) d[t] = _mm256_mul_ps(_mm256_set1_ps(ys[t][b].d), dx);
#pragma GCC unroll 8
    for (int s = 0; s < 8; ++s) {
      __m256i sum[N];
      for (int t = 0; t < N; ++t) sum[t] = _mm256_setzero_si256();
      for (int h = 0; h < 2; ++h) {
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.qs[h][s]));
        for (int k = 0; k < 4; ++k) {
          const __m256i u = _mm256_and_si256(k ? _mm256_srli_epi16(q, 2 * k) : q, m3);
          for (int t = 0; t < N; ++t)
            sum[t] = _mm256_add_epi16(
                sum[t], _mm256_maddubs_epi16(u, bcast32(ys[t][b].qs + 128 * h + 32 * k + 4 * s)));
        }
      }
      for (int t = 0; t < N; ++t) {
        const __m256i lane =
            _mm256_madd_epi16(_mm256_sub_epi16(sum[t], bcast32(ys[t][b].bsums + 2 * s)), ones16);
        acc[t][s] = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(lane), d[t]), acc[t][s]);
      }
    }
  });
}

// Q2_0 (rows8_body.h's q2_0_group): codes (0..3) against activations in 16 bits, a Q8_0 block's
// eight steps (each pair <= 2 x 3 x 128) added there, then in pairs into i32.
struct Q2_0Maddubs {
  static __m256i sum8(const __m256i* u, const __m256i* a) {
    __m256i s = _mm256_maddubs_epi16(u[0], a[0]);
    for (int j = 1; j < 8; ++j) s = _mm256_add_epi16(s, _mm256_maddubs_epi16(u[j], a[j]));
    return _mm256_madd_epi16(s, _mm256_set1_epi16(1));
  }
  static __m256i sums4(__m256i a) {  // the activations' 4-element sums
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), a), _mm256_set1_epi16(1));
  }
};

// Q8_0: the values' magnitudes against the activations given the values' signs (the dot's
// arithmetic, x86::b32_step), each block's exact sum into its row's lane.
template <int N>
void q8_0_group(const BlockQ8_0x8* x, int64_t nb, const BlockQ8_0* const* ys, float* out) {
  const __m256i ones16 = _mm256_set1_epi16(1);
  blocks<N, 64>(x, nb, out, [&](int64_t b, const BlockQ8_0x8& w, __m256(*acc)[8]) {
    __m256i I[N];
    for (int t = 0; t < N; ++t) I[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int s = 0; s < 8; ++s) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.qs[s]));
      const __m256i aq = _mm256_abs_epi8(q);
      for (int t = 0; t < N; ++t) {
        const __m256i a = _mm256_sign_epi8(bcast32(ys[t][b].qs + 4 * s), q);
        I[t] = _mm256_add_epi32(I[t], _mm256_madd_epi16(_mm256_maddubs_epi16(aq, a), ones16));
      }
    }
    const __m256 dx = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.d)));
    const int l = int(b & 7);
    for (int t = 0; t < N; ++t) {
      const __m256 dy = _mm256_cvtph_ps(_mm_set1_epi16(static_cast<short>(ys[t][b].d)));
      acc[t][l] =
          _mm256_add_ps(acc[t][l], _mm256_mul_ps(_mm256_mul_ps(dx, dy), _mm256_cvtepi32_ps(I[t])));
    }
  });
}

// IQ4_XS: 4-bit indices into kvalues_iq4nl (signed), a signed 6-bit scale per 32 weights. A
// step's low nibbles are weights 4s.. of the sub-block, its high ones 16 + 4s..; each row's |w|
// against the activations with w's signs, the pairs' i16 sums (at most 2 x 127 x 127) times the
// row's scale into its i32 lane.
template <int N>
void iq4_xs_group(const BlockIq4Xsx8* x, int64_t nb, const BlockQ8K* const* ys, float* out) {
  const __m256i table = _mm256_broadcastsi128_si256(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(iq::kvalues_iq4nl)));
  const __m256i low4 = _mm256_set1_epi8(0xF);
  blocks<N, 16>(x, nb, out, [&](int64_t b, const BlockIq4Xsx8& w, __m256(*acc)[8]) {
    __m256i I[N];
    for (int t = 0; t < N; ++t) I[t] = _mm256_setzero_si256();
#pragma GCC unroll 1
    for (int ib = 0; ib < 8; ++ib) {
      const __m128i sb = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w.scales[ib]));
      const __m256i sc = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(sb, sb));  // (v_r, v_r) words
#pragma GCC unroll 4
      for (int s = 0; s < 4; ++s) {
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.qs[ib][s]));
        const __m256i wl = _mm256_shuffle_epi8(table, _mm256_and_si256(q, low4));
        const __m256i wh =
            _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(q, 4), low4));
        const __m256i al = _mm256_sign_epi8(wl, wl), ah = _mm256_sign_epi8(wh, wh);
        for (int t = 0; t < N; ++t) {
          const int8_t* a = ys[t][b].qs + 32 * ib + 4 * s;
          const __m256i pl = _mm256_maddubs_epi16(al, _mm256_sign_epi8(bcast32(a), wl));
          const __m256i ph = _mm256_maddubs_epi16(ah, _mm256_sign_epi8(bcast32(a + 16), wh));
          I[t] = _mm256_add_epi32(
              I[t], _mm256_add_epi32(_mm256_madd_epi16(pl, sc), _mm256_madd_epi16(ph, sc)));
        }
      }
    }
    sb_lane<N, false>(w.d, nullptr, ys, b, I, nullptr, acc);
  });
}

// Q6_K: step s of half h holds, per row, elements 128h + 32j + 4s.. for j = 0..3 (the low nibbles
// of chunk 0 and 1, then their high nibbles, each with its pair of high bits from qh): codes 0..63
// against the activations, times sub-block 8h + 2j + s / 4's scale into I, less 32 x the scales
// against the activations' 16-element sums (the row dot's arithmetic, avx2_quants.cpp's q6k_rows).
template <int N>
void q6_k_group(const BlockQ6Kx8* x, int64_t nb, const BlockQ8K* const* ys, float* out) {
  const __m256i low4 = _mm256_set1_epi8(0xF), hi2 = _mm256_set1_epi8(0x30);
  const PairShuffles& sh = kPairShuffles;
  blocks<N, 11>(x, nb, out, [&](int64_t b, const BlockQ6Kx8& w, __m256(*acc)[8]) {
    __m256i I[N], B[N];
    for (int t = 0; t < N; ++t) I[t] = B[t] = _mm256_setzero_si256();
    for (int p = 0; p < 8; ++p) {  // sub-blocks 2p, 2p + 1: the scales against the 16-element sums
      const __m256i sc = sign_words(shuffle_pair(load_pair(w.scales[2 * p]), sh.pair));
      for (int t = 0; t < N; ++t)
        B[t] = _mm256_add_epi32(B[t], _mm256_madd_epi16(sc, bcast32(ys[t][b].bsums + 2 * p)));
    }
    for (int h = 0; h < 2; ++h)
      for (int s4 = 0; s4 < 2; ++s4) {
        __m256i sc[4];  // sub-block 8h + 2j + s4's scales as (v_r, v_r) words
        for (int j = 0; j < 4; ++j) {
          const __m128i v =
              _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w.scales[8 * h + 2 * j + s4]));
          sc[j] = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(v, v));
        }
#pragma GCC unroll 4
        for (int s = 4 * s4; s < 4 * s4 + 4; ++s) {
          const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.ql[h][0][s]));
          const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.ql[h][1][s]));
          const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.qh[h][s]));
          // qh's bit pairs 0, 2, 4, 6 of each byte moved to bits 4-5 (16-bit shifts: the mask
          // keeps only the byte's own bits)
          const __m256i q[4] = {_mm256_or_si256(_mm256_and_si256(l0, low4),
                                                _mm256_and_si256(_mm256_slli_epi16(qh, 4), hi2)),
                                _mm256_or_si256(_mm256_and_si256(l1, low4),
                                                _mm256_and_si256(_mm256_slli_epi16(qh, 2), hi2)),
                                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4),
                                                _mm256_and_si256(qh, hi2)),
                                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4),
                                                _mm256_and_si256(_mm256_srli_epi16(qh, 2), hi2))};
          for (int t = 0; t < N; ++t) {
            const int8_t* a = ys[t][b].qs + 128 * h + 4 * s;
            for (int j = 0; j < 4; ++j)
              I[t] = _mm256_add_epi32(
                  I[t], _mm256_madd_epi16(_mm256_maddubs_epi16(q[j], bcast32(a + 32 * j)), sc[j]));
          }
        }
      }
    for (int t = 0; t < N; ++t) I[t] = _mm256_sub_epi32(I[t], _mm256_slli_epi32(B[t], 5));
    sb_lane<N, false>(w.d, nullptr, ys, b, I, nullptr, acc);
  });
}

// rows8_body.h's b32_group: the fifth bits moved to bits 4..7 of their bytes (the low nibble's by
// a shift of qh, once a block), so that the tested bit, at least 16, is 16 by vpminub: a shuffle,
// an and and a min (a compare and a second and before); the codes' sums by vpmaddubsw and vpmaddwd
// (IQ4_NL's signed table as |w| against the activations with w's signs).
struct B32Avx2 {
  static constexpr bool kBiasedTable = false;
  static __m256i add_fifth(__m256i v, __m256i qh, int byte, int nibble) {
    const __m256i at = _mm256_shuffle_epi8(
        nibble ? qh : _mm256_slli_epi16(qh, 4),
        _mm256_load_si256(reinterpret_cast<const __m256i*>(kFifth.bytes[byte])));
    const __m256i bit =
        _mm256_and_si256(at, _mm256_load_si256(reinterpret_cast<const __m256i*>(kFifth.bits[1])));
    return _mm256_or_si256(v, _mm256_min_epu8(bit, _mm256_set1_epi8(16)));
  }
  static __m256i code_sums(__m256i u, __m256i a) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, a), _mm256_set1_epi16(1));
  }
  static __m256i code_sums(__m256i sum, __m256i u, __m256i a) {  // added into sum
    return _mm256_add_epi32(sum, code_sums(u, a));
  }
};

}  // namespace

void rows8_q6_k(const BlockQ6Kx8* group, int64_t cols, const BlockQ8K* const* ys, int n_tok,
                float* out) {
  x86::with_n(n_tok, [&](auto N) { q6_k_group<N>(group, cols / kQK_K, ys, out); });
}

void rows8_b32(uint32_t wtype, const void* group, int64_t cols, const void* const* ys, int n_tok,
               float* out) {
  x86::with_n(n_tok, [&](auto N) { b32_rows<B32Avx2, N>(wtype, group, cols / kQK8_0, ys, out); });
}

void rows8_q8_0(const BlockQ8_0x8* group, int64_t cols, const BlockQ8_0* const* ys, int n_tok,
                float* out) {
  x86::with_n(n_tok, [&](auto N) { q8_0_group<N>(group, cols / kQK8_0, ys, out); });
}

void rows8_mxfp4(const BlockMxfp4x8* group, int64_t cols, const BlockQ8_0* const* ys, int n_tok,
                 float* out) {
  x86::with_n(n_tok, [&](auto N) { mxfp4_group<N>(group, cols / kQK8_0, ys, out); });
}

void rows8_q1_0(const BlockQ1_0x8* group, int64_t cols, const BlockQ8_0* const* ys, int n_tok,
                float* out) {
  x86::with_n(n_tok, [&](auto N) { q1_0_rows8<N>(group, cols / 128, ys, out); });
}

void rows8_q2_0(const BlockQ2_0x8* group, int64_t cols, const BlockQ8_0* const* ys, int n_tok,
                float* out) {
  x86::with_n(n_tok, [&](auto N) { q2_0_group<Q2_0Maddubs, N>(group, cols / 64, ys, out); });
}

void rows8_tq2_0(const BlockTq2_0x8* group, int64_t cols, const BlockQ8K* const* ys, int n_tok,
                 float* out) {
  x86::with_n(n_tok, [&](auto N) { tq2_0_group<N>(group, cols / kQK_K, ys, out); });
}

void rows8_nvfp4(const BlockNvfp4x8* group, int64_t cols, const BlockQ8_0* const* ys, int n_tok,
                 float* out) {
  x86::with_n(n_tok, [&](auto N) { nvfp4_group<NvfpMaddubs, N>(group, cols / 64, ys, out); });
}

void rows8_q2_k(const BlockQ2Kx8* group, int64_t cols, const BlockQ8K* const* ys, int n_tok,
                float* out) {
  x86::with_n(n_tok, [&](auto N) { q2_k_group<N>(group, cols / kQK_K, ys, out); });
}

void rows8_q3_k(const BlockQ3Kx8* group, int64_t cols, const BlockQ8K* const* ys, int n_tok,
                float* out) {
  x86::with_n(n_tok, [&](auto N) { q3_k_group<N>(group, cols / kQK_K, ys, out); });
}

void transpose8_u32(const void* in, uint8_t* const* rows) {
  const auto* v = static_cast<const __m256*>(in);
  __m256 r[8], t[8];
  for (int s = 0; s < 8; ++s) r[s] = _mm256_loadu_ps(reinterpret_cast<const float*>(v + s));
  for (int s = 0; s < 8; s += 2)
    t[s] = _mm256_unpacklo_ps(r[s], r[s + 1]), t[s + 1] = _mm256_unpackhi_ps(r[s], r[s + 1]);
  for (int s = 0; s < 8; s += 4)
    for (int k = 0; k < 2; ++k) {
      r[s + 2 * k] = _mm256_shuffle_ps(t[s + k], t[s + 2 + k], 0x44);
      r[s + 2 * k + 1] = _mm256_shuffle_ps(t[s + k], t[s + 2 + k], 0xEE);
    }
  // r[0..3]: rows 0, 1, 2, 3 (low half) and 4, 5, 6, 7 (high half) of steps 0-3; r[4..7] of 4-7
  for (int k = 0; k < 4; ++k) {
    _mm256_storeu_ps(reinterpret_cast<float*>(rows[k]),
                     _mm256_permute2f128_ps(r[k], r[4 + k], 0x20));
    _mm256_storeu_ps(reinterpret_cast<float*>(rows[4 + k]),
                     _mm256_permute2f128_ps(r[k], r[4 + k], 0x31));
  }
}

void rows8_q4_k(const BlockQ4Kx8* group, int64_t cols, const BlockQ8K* const* ys, int n_tok,
                float* out) {
  x86::with_n(n_tok, [&](auto N) { k45_group<N, false>(group, cols / kQK_K, ys, out); });
}

void rows8_q5_k(const BlockQ5Kx8* group, int64_t cols, const BlockQ8K* const* ys, int n_tok,
                float* out) {
  x86::with_n(n_tok, [&](auto N) { k45_group<N, true>(group, cols / kQK_K, ys, out); });
}

void rows8_iq4_xs(const BlockIq4Xsx8* group, int64_t cols, const BlockQ8K* const* ys, int n_tok,
                  float* out) {
  x86::with_n(n_tok, [&](auto N) { iq4_xs_group<N>(group, cols / kQK_K, ys, out); });
}

}  // namespace kernels::avx2
