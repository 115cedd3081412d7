// The AVX-512 VNNI bodies of the low-bit types that have no AVX-512 kernel elsewhere (TQ1_0,
// TQ2_0), compiled with avx512.cpp's flags. Each gives the AVX2 body's bits (TQ1_0's are the
// reference's too).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/avx2.h"
#include "kernels/fp16.h"
#include "kernels/isa.h"
#include "kernels/kernels.h"
#include "kernels/x86.h"

namespace kernels::avx512 {
namespace {

// A * 3 mod 256 in every byte (two byte adds).
inline __m256i times3(__m256i a) {
  return _mm256_add_epi8(_mm256_add_epi8(a, a), a);
}

// TQ1_0: weight e is base-3 digit n of its byte, digit = ((uint8_t)(byte * 3^n) * 3) >> 8, i.e.
// 0, 1 or 2 as (uint8_t)(byte * 3^n) is below 86, below 171, or not. A super-block is four zmm of
// bytes in element order (qs[0..32) twice; qs[0..32), qs[32..48) twice; qs[32..48) three times
// and qh's four bytes four times), each byte multiplied by its 3^n with two vpmullw (the even
// bytes' products are the low bytes of one, the odd bytes' the high bytes of the other), the
// digits two unsigned compares into masks, met by vpdpbusd with the activations; the activations'
// block sums come off, one exact integer a super-block, scaled as the reference does: its bits.
struct Tq1Powers {
  alignas(64) int16_t m[4][32];  // the 16-bit lanes' multipliers (a lane's two bytes share one)
  Tq1Powers() {
    static const int16_t pow3[5] = {1, 3, 9, 27, 81};
    for (int w = 0; w < 32; ++w) {
      m[0][w] = pow3[w / 16];                      // digits 0, 1 of qs[0..32)
      m[1][w] = pow3[2 + w / 16];                  // digits 2, 3
      m[2][w] = w < 16 ? 81 : pow3[(w - 16) / 8];  // digit 4; digits 0, 1 of qs[32..48)
      m[3][w] = w < 24 ? pow3[2 + w / 8] : pow3[(w - 24) / 2];  // digits 2-4; qh's 0-3
    }
  }
};
const Tq1Powers kTq1;

template <int N>
void tq1_0_digits(const BlockTq1_0* x, const BlockQ8K* const* ys, int64_t n, float* out) {
  __m512i pw[4];
  for (int k = 0; k < 4; ++k) pw[k] = _mm512_load_si512(kTq1.m[k]);
  const __m512i odd = _mm512_set1_epi16(int16_t(0xFF00)), even = _mm512_set1_epi16(0x00FF);
  const __m512i c86 = _mm512_set1_epi8(86), c171 = _mm512_set1_epi8(char(171));
  const __m512i one = _mm512_set1_epi8(1), two = _mm512_set1_epi8(2);
  float s[N] = {};
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    x86::prefetch_ahead(x + b);
    x86::prefetch_ahead(reinterpret_cast<const uint8_t*>(x + b) + 64);
    const uint8_t* q = x[b].qs;
    uint32_t qh;
    std::memcpy(&qh, x[b].qh, 4);
    const __m512i a =
        _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)));
    const __m512i c =
        _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 32)));
    const __m512i p[4] = {a, a, _mm512_inserti64x4(a, _mm512_castsi512_si256(c), 1),
                          _mm512_mask_set1_epi32(c, 0xF000, static_cast<int>(qh))};
    const __m512i a_odd = _mm512_and_si512(a, odd);
    __m512i digit[4];
    for (int k = 0; k < 4; ++k) {
      const __m512i po = k < 2 ? a_odd : _mm512_and_si512(p[k], odd);
      // (lo & 0x00FF) | hi: the even bytes' products from lo, the odd bytes' from hi.
      const __m512i prod = _mm512_ternarylogic_epi32(_mm512_mullo_epi16(p[k], pw[k]),
                                                     _mm512_mullo_epi16(po, pw[k]), even, 0xEC);
      const __mmask64 ge1 = _mm512_cmpge_epu8_mask(prod, c86);
      const __mmask64 ge2 = _mm512_cmpge_epu8_mask(prod, c171);
      digit[k] = _mm512_mask_mov_epi8(_mm512_maskz_mov_epi8(ge1, one), ge2, two);
    }
    const float dx = fp16_to_fp32(x[b].d);
    for (int t = 0; t < N; ++t) {
      const BlockQ8K& yb = ys[t][b];
      __m512i acc = _mm512_setzero_si512();
      for (int k = 0; k < 4; ++k)
        acc = _mm512_dpbusd_epi32(acc, digit[k], _mm512_loadu_si512(yb.qs + 64 * k));
      const __m256i bs = _mm256_madd_epi16(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(yb.bsums)), _mm256_set1_epi16(1));
      const __m256i v = _mm256_sub_epi32(
          _mm256_add_epi32(_mm512_castsi512_si256(acc), _mm512_extracti64x4_epi64(acc, 1)), bs);
      s[t] += static_cast<float>(x86::hsum_i32(v)) * (dx * yb.d);
    }
  }
  for (int t = 0; t < N; ++t) out[t] = s[t];
}

// TQ1_0 for one token: with x = (uint8_t)(byte * 3^n) and x' = (uint8_t)(3x), the next digit's
// product, digit n is (3x - x') / 256 exactly. So the digits need no forming: over a super-block,
// sum(digit * y) = (3 S - T) / 256 with S = sum(x * y) and T = sum(x' * y), each vpdpbusd of the
// products themselves (u8) with the activations (i8), exact integers (|3S| < 2^25). The products
// are eight ymm in element order, each from the one before by byte adds as in the AVX2 body
// (digits 0-4 of qs[0..32); digits 0, 1 | 2, 3 of qs[32..48); digit 4 of qs[32..48) with qh's
// digits 0-3 in its four bytes' dwords), and x' of each is the next register or three times it:
// no multiplies, compares or masked moves, against the digits' body, at twice its vpdpbusd work
// a token. One exact integer a super-block, scaled as the reference does: its bits.
void tq1_0_one(const BlockTq1_0* x, const BlockQ8K* y, int64_t n, float* out) {
  const __m256i k256 = _mm256_set1_epi16(256);
  __m128 s = _mm_setzero_ps();
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    x86::prefetch_ahead(x + b);
    x86::prefetch_ahead(reinterpret_cast<const uint8_t*>(x + b) + 64);
    const uint8_t* q = x[b].qs;
    __m256i v[8], nx[8];  // the products in element order; each one's next digit's products
    v[0] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
    for (int k = 1; k < 5; ++k) v[k] = nx[k - 1] = times3(v[k - 1]);
    nx[4] = times3(v[4]);
    const __m256i r =
        _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 32)));
    v[5] = _mm256_blend_epi32(r, times3(r), 0xF0);  // digits 0 | 1 of qs[32..48)
    nx[5] = times3(v[5]);
    v[6] = times3(nx[5]);  // digits 2 | 3
    nx[6] = times3(v[6]);
    uint32_t qh;
    std::memcpy(&qh, x[b].qh, 4);
    // digit 2 of qs[32..48) | qh four times; then times 3 where the byte is not yet at its digit:
    // digit 4 below, qh's digits 0-3 in the dwords above.
    v[7] = _mm256_blend_epi32(v[6], _mm256_set1_epi32(static_cast<int>(qh)), 0xF0);
    for (const __mmask32 k : {0xFFF0FFFFu, 0xFF00FFFFu, 0xF0000000u})
      v[7] = _mm256_mask_add_epi8(v[7], k, v[7], _mm256_add_epi8(v[7], v[7]));
    nx[7] = times3(v[7]);
    const BlockQ8K& yb = y[b];
    // T starts at 256 times the activations' sum (the digits' -1): 3 S - T is 256 times the dot.
    __m256i sa = _mm256_setzero_si256(), sb = sa, tb = sa;
    __m256i ta =
        _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(yb.bsums)), k256);
    for (int k = 0; k < 8; k += 2) {
      const __m256i y0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(yb.qs + 32 * k));
      const __m256i y1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(yb.qs + 32 * k + 32));
      sa = _mm256_dpbusd_epi32(sa, v[k], y0);
      ta = _mm256_dpbusd_epi32(ta, nx[k], y0);
      sb = _mm256_dpbusd_epi32(sb, v[k + 1], y1);
      tb = _mm256_dpbusd_epi32(tb, nx[k + 1], y1);
    }
    const __m256i s1 = _mm256_add_epi32(sa, sb);
    const __m256i w =
        _mm256_sub_epi32(_mm256_add_epi32(s1, _mm256_add_epi32(s1, s1)), _mm256_add_epi32(ta, tb));
    // The sum in the low lane, kept in a vector register (no round trip through a general one).
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
    h = _mm_add_epi32(h, _mm_unpackhi_epi64(h, h));
    h = _mm_srai_epi32(_mm_add_epi32(h, _mm_shuffle_epi32(h, 0xB1)), 8);
    const float dx = fp16_to_fp32(x[b].d);
    s = _mm_add_ss(s, _mm_mul_ss(_mm_cvtepi32_ps(h), _mm_set_ss(dx * yb.d)));
  }
  *out = _mm_cvtss_f32(s);
}

// Decode (one token) takes the products' body: its weights' side costs less, its dot more, so
// tiles of 2-4 tokens (prefill) keep the digits' (prefill-64 of a 4-layer TQ1_0 model lost ~18%
// with the products' body for every tile, Zen 4).
template <int N>
void tq1_0_rows(const BlockTq1_0* x, const BlockQ8K* const* ys, int64_t n, float* out) {
  if constexpr (N == 1)
    tq1_0_one(x, ys[0], n, out);
  else
    tq1_0_digits<N>(x, ys, n, out);
}

// TQ2_0 in the AVX2 row dot's order (avx2_quants.cpp's dot_tq2_0, llama.cpp's): lane l of a
// super-block is the products of bytes 4l .. 4l + 3 of both 32-byte halves of qs, all four codes
// of each, less the activations' 16-element sums 2l and 2l + 1; acc = float(lane) * (dy * dx) +
// acc in eight float lanes, summed as x86::hsum does. Here each code k is its byte masked to bits
// 2k, 2k + 1 (the code times 4^k, no shift), met by vpdpbusd in its own i32 sums (no 16-bit step
// to saturate, a code of 3 included), which are divided by 4^k exactly; the block sums come off
// by one vpdpwssd by -1. The same integers, the same float steps: the AVX2 body's bits, with 8
// masks and 8 vpdpbusd a super-block a token in place of 8 masks, 6 shifts, 8 vpmaddubsw and the
// 16-bit adds.
template <int N>
void tq2_0_rows(const BlockTq2_0* x, const BlockQ8K* const* ys, int64_t n, float* out) {
  const __m256i minus1 = _mm256_set1_epi16(-1);
  __m256 acc[N];
  for (int t = 0; t < N; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    x86::prefetch_ahead(x + b);
    x86::prefetch_ahead(reinterpret_cast<const uint8_t*>(x + b) + 64);
    const __m256i q[2] = {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs)),
                          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs + 32))};
    __m256i c[4][2];  // [code k][half j]: the bytes masked to code k's bits
    for (int k = 0; k < 4; ++k)
      for (int j = 0; j < 2; ++j)
        c[k][j] = _mm256_and_si256(q[j], _mm256_set1_epi8(static_cast<char>(3 << (2 * k))));
    const float dx = fp16_to_fp32(x[b].d);
    for (int t = 0; t < N; ++t) {
      const BlockQ8K& y = ys[t][b];
      __m256i s[4];
      s[0] = _mm256_dpwssd_epi32(_mm256_setzero_si256(),
                                 _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y.bsums)),
                                 minus1);
      for (int k = 1; k < 4; ++k) s[k] = _mm256_setzero_si256();
      for (int k = 0; k < 4; ++k)
        for (int j = 0; j < 2; ++j)
          s[k] = _mm256_dpbusd_epi32(
              s[k], c[k][j],
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y.qs + 128 * j + 32 * k)));
      const __m256i lane = _mm256_add_epi32(
          _mm256_add_epi32(s[0], _mm256_srai_epi32(s[1], 2)),
          _mm256_add_epi32(_mm256_srai_epi32(s[2], 4), _mm256_srai_epi32(s[3], 6)));
      acc[t] =
          _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(lane), _mm256_set1_ps(y.d * dx)), acc[t]);
    }
  }
  for (int t = 0; t < N; ++t) out[t] = x86::hsum(acc[t]);
}

}  // namespace

using x86::with_n;
EXPERTD_ROWS_KERNEL(tq1_0, BlockTq1_0, BlockQ8K, tq1_0_rows)
EXPERTD_ROWS_KERNEL(tq2_0, BlockTq2_0, BlockQ8K, tq2_0_rows)

}  // namespace kernels::avx512
