// The interleaved rows' bodies of Q2_K, Q3_K, IQ4_XS and NVFP4 with AVX-512 VNNI's instructions on
// 256-bit registers (VL; flags in CMakeLists.txt). vpdpbusd sums four u8 x i8 products into an i32
// with no 16-bit step to overflow, so a 2-bit code needs no shift: the step's byte masked to code
// j's bits (code x 4^j) goes straight into the sub-block's sum, which is divided by 4^j (exact)
// once per sub-block; Q3_K's high bit is moved in above its code (one vpternlogd), so one vpdpbusd
// a step sums code + 4 x high bit (two, one for the bits apart, read 0.83 of the memory stream on
// AMD's Zen 4 against 0.92, whose vpdpbusd was the limit). Each sub-block's sum fits 16 bits, so
// one vpdpwssd by the scale (kZx: the lane's low word) adds it into the super-block's exact integer
// sum, which goes through the rows' arithmetic (rows8_body.h's sb_lane): bit for bit the AVX2
// bodies and the rows' dots.
#include <immintrin.h>

#include "kernels/rows8.h"
#include "kernels/rows8_body.h"
#include "kernels/x86.h"

namespace kernels::avx512 {

namespace {

// Sub-block pair P (rows8_avx2.cpp's two_bit_pair): each step's codes (and high bits) against
// the activations into the two sub-blocks' i32 sums, then times the scales (s_lo, s_hi: kZx
// words) into I.
template <int N, bool kHigh, int P, class Block>
__attribute__((always_inline)) inline void two_bit_pair(const Block& w, __m256i s_lo, __m256i s_hi,
                                                        const BlockQ8K* const* ys, int64_t b,
                                                        __m256i* I) {
  constexpr int h = P / 4, j = P % 4, k = 4 * h + j;
  // the codes at bits c .. c + 1 of each byte (c = 2j; Q3_K's last pair's moved down to 4), the
  // high bit moved in above them: the byte is 2^c (code + 4 x high bit), < 2^8
  constexpr int c = kHigh && j == 3 ? 4 : 2 * j, d = c + 2 - k;
  const __m256i mq = _mm256_set1_epi8(static_cast<char>(3 << c));
  const __m256i mh = _mm256_set1_epi8(static_cast<char>(4 << c));
  __m256i q[2][N];  // [sub-block of the pair][token]
  for (int t = 0; t < N; ++t) q[0][t] = q[1][t] = _mm256_setzero_si256();
#pragma GCC unroll 8
  for (int s = 0; s < 8; ++s) {
    __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.qs[h][s]));
    if constexpr (c != 2 * j) u = _mm256_srli_epi16(u, 2 * j - c);
    u = _mm256_and_si256(u, mq);
    if constexpr (kHigh) {
      // hmask bit k of each byte to bit c + 2 (by a 16-bit shift: the bit stays in its byte)
      __m256i hm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.hmask[s]));
      if constexpr (d > 0) hm = _mm256_slli_epi16(hm, d);
      if constexpr (d < 0) hm = _mm256_srli_epi16(hm, -d);
      u = _mm256_ternarylogic_epi32(u, hm, mh, 0xF8);  // u | (hm & mh)
    }
    for (int t = 0; t < N; ++t)
      q[s / 4][t] =
          _mm256_dpbusd_epi32(q[s / 4][t], u, bcast32(ys[t][b].qs + 128 * h + 32 * j + 4 * s));
  }
  for (int t = 0; t < N; ++t)
    for (int i = 0; i < 2; ++i)  // sum of (code + 4 x high bit) x a
      I[t] =
          _mm256_dpwssd_epi32(I[t], c ? _mm256_srai_epi32(q[i][t], c) : q[i][t], i ? s_hi : s_lo);
}

// Q2_K: codes 0..3 times the sub-block scales, less the mins against the activations' 16-element
// sums.
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
        M[t] = _mm256_dpwssd_epi32(M[t], mins, bcast32(ys[t][b].bsums + 2 * P));
      two_bit_pair<N, false, P>(w, _mm256_and_si256(shuffle_pair(v, sh.zx[0]), low4),
                                _mm256_and_si256(shuffle_pair(v, sh.zx[1]), low4), ys, b, I);
    });
    sb_lane<N, true>(w.d, w.dmin, ys, b, I, M, acc);
  });
}

// Q3_K: u = code + 4 x high bit (0..7) times the sub-block scales, less 4 x the scales against the
// activations' 16-element sums.
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
        B[t] = _mm256_dpwssd_epi32(B[t], sc, bcast32(ys[t][b].bsums + 2 * P));
      two_bit_pair<N, true, P>(w, sign_words(shuffle_pair(v, sh.zx[0])),
                               sign_words(shuffle_pair(v, sh.zx[1])), ys, b, I);
    });
    for (int t = 0; t < N; ++t) I[t] = _mm256_sub_epi32(I[t], _mm256_slli_epi32(B[t], 2));
    sb_lane<N, false>(w.d, nullptr, ys, b, I, nullptr, acc);
  });
}

// IQ4_XS: the table's values + 128 (1..241) as unsigned bytes against the activations, by
// vpdpbusd into each sub-block's i32 sum with no 16-bit step and no signs to move (the AVX2 body's
// |w| against the activations with w's signs takes four more operations a step); less 128 x the
// sub-block's activation sum, and times the row's scale (vpmulld: the sum needs more than 16 bits)
// into I: the rows' exact integer sum.
template <int N>
void iq4_xs_group(const BlockIq4Xsx8* x, int64_t nb, const BlockQ8K* const* ys, float* out) {
  const __m256i table = _mm256_add_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128(
                                            reinterpret_cast<const __m128i*>(iq::kvalues_iq4nl))),
                                        _mm256_set1_epi8(static_cast<char>(0x80)));
  const __m256i low4 = _mm256_set1_epi8(0xF);
  blocks<N, 16>(x, nb, out, [&](int64_t b, const BlockIq4Xsx8& w, __m256(*acc)[8]) {
    __m256i I[N];
    for (int t = 0; t < N; ++t) I[t] = _mm256_setzero_si256();
#pragma GCC unroll 2
    for (int ib = 0; ib < 8; ++ib) {
      __m256i S[N];
      for (int t = 0; t < N; ++t) {  // -128 x the sub-block's activations, in every lane
        const int16_t* bs = ys[t][b].bsums + 2 * ib;
        S[t] = _mm256_set1_epi32(-128 * (int32_t(bs[0]) + bs[1]));
      }
#pragma GCC unroll 4
      for (int s = 0; s < 4; ++s) {
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.qs[ib][s]));
        const __m256i lo = _mm256_shuffle_epi8(table, _mm256_and_si256(q, low4));
        const __m256i hi =
            _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(q, 4), low4));
        for (int t = 0; t < N; ++t) {
          const int8_t* a = ys[t][b].qs + 32 * ib + 4 * s;
          S[t] = _mm256_dpbusd_epi32(S[t], lo, bcast32(a));
          S[t] = _mm256_dpbusd_epi32(S[t], hi, bcast32(a + 16));
        }
      }
      const __m256i sc =
          _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w.scales[ib])));
      for (int t = 0; t < N; ++t) I[t] = _mm256_add_epi32(I[t], _mm256_mullo_epi32(S[t], sc));
    }
    sb_lane<N, false>(w.d, nullptr, ys, b, I, nullptr, acc);
  });
}

// rows8_body.h's b32_group: the fifth bits as a mask by one vptestmb, 16 added by one masked
// vpaddb (three operations a step's nibbles, AVX2's five); the codes' sums by one vpdpbusd (AVX2's
// vpmaddubsw and vpmaddwd), IQ4_NL's table biased by 128 to sum it so (AVX2: abs, sign, vpmaddubsw,
// vpmaddwd). The same bytes and integers.
struct B32Vnni {
  static constexpr bool kBiasedTable = true;
  static __m256i add_fifth(__m256i v, __m256i qh, int byte, int nibble) {
    const __m256i at = _mm256_shuffle_epi8(
        qh, _mm256_load_si256(reinterpret_cast<const __m256i*>(kFifth.bytes[byte])));
    const __mmask32 set = _mm256_test_epi8_mask(
        at, _mm256_load_si256(reinterpret_cast<const __m256i*>(kFifth.bits[nibble])));
    return _mm256_mask_add_epi8(v, set, v, _mm256_set1_epi8(16));
  }
  static __m256i code_sums(__m256i u, __m256i a) { return code_sums(_mm256_setzero_si256(), u, a); }
  static __m256i code_sums(__m256i sum, __m256i u, __m256i a) {  // added into sum
    return _mm256_dpbusd_epi32(sum, u, a);
  }
};

// NVFP4 (rows8_body.h's nvfp4_group): two steps' sums in one chain of vpdpbusd.
struct NvfpVnni {
  static __m256i dot2(__m256i u0, __m256i s0, __m256i u1, __m256i s1) {
    return _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), u0, s0), u1, s1);
  }
};

// Q1_0 (rows8.h's BlockQ1_0x8) in the rows' dot's order (avx2::dot_q1_0's; rows8_avx2.cpp's
// q1_0_rows8 says which), in 512-bit registers: one holds the eight rows' two lanes 2p, 2p + 1 (row
// j / 2, lane 2p + j % 2 in its lane j), its 64-bit mask the rows' byte 4k + p as they lie, one
// masked move picks each activation or its negation (the block's activations negated once a
// token), vpdpbusd against ones gives the dot's integers.
template <int N>
void q1_0_rows8(const BlockQ1_0x8* x, int64_t nb, const BlockQ8_0* const* ys, float* out) {
  const __m512i ones8 = _mm512_set1_epi8(1);
  const __m512i pairs = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  __m512 acc[N][4];
  for (int t = 0; t < N; ++t)
    for (int p = 0; p < 4; ++p) acc[t][p] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    for (size_t o = 0; o < sizeof(BlockQ1_0x8); o += 64)
      _mm_prefetch(reinterpret_cast<const char*>(x + b + 128) + o, _MM_HINT_T1);
    const BlockQ1_0x8& w = x[b];
    const __m512 dx = _mm512_permutexvar_ps(
        pairs, _mm512_castps256_ps512(
                   _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.d)))));
    __m512 dy[N][4];
    alignas(32) int8_t neg[N][4][32];
    for (int t = 0; t < N; ++t)
      for (int k = 0; k < 4; ++k) {
        const BlockQ8_0& y = ys[t][4 * b + k];
        dy[t][k] = _mm512_set1_ps(_cvtsh_ss(y.d));
        _mm256_store_si256(
            reinterpret_cast<__m256i*>(neg[t][k]),
            _mm256_sub_epi8(_mm256_setzero_si256(),
                            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y.qs))));
      }
    for (int p = 0; p < 4; ++p) {
      __m512 blk[N];
      for (int k = 0; k < 4; ++k) {
        uint64_t bits;
        std::memcpy(&bits, w.qs[4 * k + p], 8);
        const __mmask64 m = _cvtu64_mask64(bits);
        for (int t = 0; t < N; ++t) {
          int64_t y8, n8;
          std::memcpy(&y8, ys[t][4 * b + k].qs + 8 * p, 8);
          std::memcpy(&n8, neg[t][k] + 8 * p, 8);
          const __m512i sy = _mm512_mask_mov_epi8(_mm512_set1_epi64(n8), m, _mm512_set1_epi64(y8));
          const __m512 s =
              _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ones8, sy));
          blk[t] = k == 0 ? _mm512_mul_ps(dy[t][k], s) : _mm512_fmadd_ps(dy[t][k], s, blk[t]);
        }
      }
      for (int t = 0; t < N; ++t) acc[t][p] = _mm512_fmadd_ps(dx, blk[t], acc[t][p]);
    }
  }
  // Row r: ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)), a_2p + e in lane 2r + e of p.
  const __m512i even_odd = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  for (int t = 0; t < N; ++t) {
    const __m512 e = _mm512_permutexvar_ps(
        even_odd,
        _mm512_add_ps(_mm512_add_ps(acc[t][0], acc[t][2]), _mm512_add_ps(acc[t][1], acc[t][3])));
    _mm256_storeu_ps(
        out + 8 * t,
        _mm256_add_ps(_mm512_castps512_ps256(e),
                      _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
  }
}

// TQ2_0 (rows8_avx2.cpp's tq2_0_group, the row dot's lanes) as avx512_lowbit.cpp's row body: code
// k masked in its byte (the code times 4^k), vpdpbusd into its own i32 sums, divided by 4^k
// exactly; the block sums' pair comes off by one vpdpwssd by -1 (the first code's sums start
// there).
template <int N>
void tq2_0_group(const BlockTq2_0x8* x, int64_t nb, const BlockQ8K* const* ys, float* out) {
  const __m256i minus1 = _mm256_set1_epi16(-1);
  blocks<N, 32>(x, nb, out, [&](int64_t b, const BlockTq2_0x8& w, __m256(*acc)[8]) {
    const __m256 dx = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.d)));
    __m256 d[N];
    for (int t = 0; t < N; ++t) d[t] = _mm256_mul_ps(_mm256_set1_ps(ys[t][b].d), dx);
#pragma GCC unroll 8
    for (int s = 0; s < 8; ++s) {
      __m256i c[2][4];  // [half h][code k]
      for (int h = 0; h < 2; ++h) {
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.qs[h][s]));
        for (int k = 0; k < 4; ++k)
          c[h][k] = _mm256_and_si256(q, _mm256_set1_epi8(static_cast<char>(3 << (2 * k))));
      }
      for (int t = 0; t < N; ++t) {
        __m256i sum[4];
        sum[0] =
            _mm256_dpwssd_epi32(_mm256_setzero_si256(), bcast32(ys[t][b].bsums + 2 * s), minus1);
        for (int k = 1; k < 4; ++k) sum[k] = _mm256_setzero_si256();
        for (int h = 0; h < 2; ++h)
          for (int k = 0; k < 4; ++k)
            sum[k] = _mm256_dpbusd_epi32(sum[k], c[h][k],
                                         bcast32(ys[t][b].qs + 128 * h + 32 * k + 4 * s));
        const __m256i lane = _mm256_add_epi32(
            _mm256_add_epi32(sum[0], _mm256_srai_epi32(sum[1], 2)),
            _mm256_add_epi32(_mm256_srai_epi32(sum[2], 4), _mm256_srai_epi32(sum[3], 6)));
        acc[t][s] = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(lane), d[t]), acc[t][s]);
      }
    }
  });
}

// Q2_0 (rows8_body.h's q2_0_group): codes against activations in one chain of vpdpbusd.
struct Q2_0Vnni {
  static __m256i sum8(const __m256i* u, const __m256i* a) {
    __m256i s = _mm256_setzero_si256();
    for (int j = 0; j < 8; ++j) s = _mm256_dpbusd_epi32(s, u[j], a[j]);
    return s;
  }
  static __m256i sums4(__m256i a) {  // the activations' 4-element sums
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(1), a);
  }
};

}  // namespace

void rows8_q1_0(const BlockQ1_0x8* group, int64_t cols, const BlockQ8_0* const* ys, int n_tok,
                float* out) {
  x86::with_n(n_tok, [&](auto N) { q1_0_rows8<N>(group, cols / 128, ys, out); });
}

void rows8_tq2_0(const BlockTq2_0x8* group, int64_t cols, const BlockQ8K* const* ys, int n_tok,
                 float* out) {
  x86::with_n(n_tok, [&](auto N) { tq2_0_group<N>(group, cols / kQK_K, ys, out); });
}

void rows8_q2_0(const BlockQ2_0x8* group, int64_t cols, const BlockQ8_0* const* ys, int n_tok,
                float* out) {
  x86::with_n(n_tok, [&](auto N) { q2_0_group<Q2_0Vnni, N>(group, cols / 64, ys, out); });
}

void rows8_nvfp4(const BlockNvfp4x8* group, int64_t cols, const BlockQ8_0* const* ys, int n_tok,
                 float* out) {
  x86::with_n(n_tok, [&](auto N) { nvfp4_group<NvfpVnni, N>(group, cols / 64, ys, out); });
}

void rows8_iq4_xs(const BlockIq4Xsx8* group, int64_t cols, const BlockQ8K* const* ys, int n_tok,
                  float* out) {
  x86::with_n(n_tok, [&](auto N) { iq4_xs_group<N>(group, cols / kQK_K, ys, out); });
}

void rows8_b32(uint32_t wtype, const void* group, int64_t cols, const void* const* ys, int n_tok,
               float* out) {
  x86::with_n(n_tok, [&](auto N) { b32_rows<B32Vnni, N>(wtype, group, cols / kQK8_0, ys, out); });
}

void rows8_q2_k(const BlockQ2Kx8* group, int64_t cols, const BlockQ8K* const* ys, int n_tok,
                float* out) {
  x86::with_n(n_tok, [&](auto N) { q2_k_group<N>(group, cols / kQK_K, ys, out); });
}

void rows8_q3_k(const BlockQ3Kx8* group, int64_t cols, const BlockQ8K* const* ys, int n_tok,
                float* out) {
  x86::with_n(n_tok, [&](auto N) { q3_k_group<N>(group, cols / kQK_K, ys, out); });
}

}  // namespace kernels::avx512
