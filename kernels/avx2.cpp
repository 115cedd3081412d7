// The AVX2 + FMA + F16C kernels (compile flags in CMakeLists.txt): exact integer sums per block
// (maddubs/madd), scaled and accumulated in eight float lanes with FMA across blocks, one
// horizontal sum per row (as llama.cpp does). What has no AVX2 body here runs the reference.
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "kernels/attend.h"
#include "kernels/fp16.h"
#include "kernels/isa.h"
#include "kernels/quantize_acts.h"
#include "kernels/x86.h"

namespace kernels::avx2 {

using x86::hsum;

namespace {
inline __m256i mul_sum_i8(__m256i x, __m256i y) {  // signed x signed, summed in i32 lanes
  return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x)),
                           _mm256_set1_epi16(1));
}
inline __m256i load(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}
}  // namespace

float dot_q8_0(const BlockQ8_0* x, const BlockQ8_0* y, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kQK8_0; ++b) {
    const __m256 d = _mm256_set1_ps(fp16_to_fp32(x[b].d) * fp16_to_fp32(y[b].d));
    acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(mul_sum_i8(load(x[b].qs), load(y[b].qs))), acc);
  }
  return hsum(acc);
}

// Q4_K and Q5_K share everything but the fifth bit.
template <bool kFive>
float dot_k45(const uint8_t* blocks, size_t stride, const BlockQ8K* y, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  float mins = 0;
  const __m256i low4 = _mm256_set1_epi8(0xF), one = _mm256_set1_epi8(1);
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const uint8_t* blk = blocks + b * stride;
    uint16_t hd, hm;
    std::memcpy(&hd, blk, 2);
    std::memcpy(&hm, blk + 2, 2);
    const uint8_t* scales = blk + 4;
    const uint8_t* qh = kFive ? blk + 16 : nullptr;
    const uint8_t* q4 = kFive ? blk + 48 : blk + 16;
    const int8_t* q8 = y[b].qs;
    __m256i hbits = kFive ? load(qh) : _mm256_setzero_si256();
    uint8_t sm[16];
    k_scales_mins(scales, sm);
    // Mins against the activations' pair sums: 8 products in one madd.
    const __m128i bs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(y[b].bsums));
    const __m128i bs2 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(y[b].bsums + 8));
    const __m128i pairs = _mm_hadd_epi16(bs, bs2);  // bsums[2j] + bsums[2j+1], j = 0..7
    const __m128i mins16 =
        _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sm + 8)));
    __m128i pm = _mm_madd_epi16(mins16, pairs);
    pm = _mm_add_epi32(pm, _mm_shuffle_epi32(pm, 0x4E));
    pm = _mm_add_epi32(pm, _mm_shuffle_epi32(pm, 0xB1));
    const int summ = _mm_cvtsi128_si32(pm);
    __m256i isum = _mm256_setzero_si256();
    for (int j = 0; j < 8; j += 2) {
      __m256i q = load(q4);
      __m256i lo = _mm256_and_si256(q, low4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
      if (kFive) {
        lo = _mm256_or_si256(
            lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, j), one), 4));
        hi = _mm256_or_si256(
            hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, j + 1), one), 4));
      }
      isum = _mm256_add_epi32(
          isum, _mm256_madd_epi16(_mm256_maddubs_epi16(lo, load(q8)), _mm256_set1_epi16(sm[j])));
      isum = _mm256_add_epi32(isum, _mm256_madd_epi16(_mm256_maddubs_epi16(hi, load(q8 + 32)),
                                                      _mm256_set1_epi16(sm[j + 1])));
      q4 += 32;
      q8 += 64;
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16_to_fp32(hd) * y[b].d), _mm256_cvtepi32_ps(isum), acc);
    mins += fp16_to_fp32(hm) * y[b].d * static_cast<float>(summ);
  }
  return hsum(acc) - mins;
}

float dot_q6_k(const BlockQ6K* x, const BlockQ8K* y, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  const __m256i m4 = _mm256_set1_epi8(0xF), m2 = _mm256_set1_epi8(3);
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const uint8_t* ql = x[b].ql;
    const uint8_t* qh = x[b].qh;
    const int8_t* sc = x[b].scales;
    const int8_t* q8 = y[b].qs;
    // sum (q - 32) * q8 = sum q * q8 - 32 * sum q8: q in 0..63 suits maddubs; the offset comes
    // from the 16-element sums of the activations.
    __m256i isum = _mm256_setzero_si256();
    for (int half = 0; half < 2; ++half) {
      __m256i l0 = load(ql), l1 = load(ql + 32), h = load(qh);
      __m256i q[4] = {
          _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(h, m2), 4)),
          _mm256_or_si256(_mm256_and_si256(l1, m4),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), m2), 4)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), m2), 4)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), m2), 4))};
      for (int g = 0; g < 4; ++g) {
        __m256i scale = _mm256_setr_m128i(_mm_set1_epi16(sc[2 * g]), _mm_set1_epi16(sc[2 * g + 1]));
        isum = _mm256_add_epi32(
            isum, _mm256_madd_epi16(_mm256_maddubs_epi16(q[g], load(q8 + 32 * g)), scale));
      }
      ql += 64;
      qh += 32;
      sc += 8;
      q8 += 128;
    }
    int offset = 0;
    for (int g = 0; g < 16; ++g) offset += x[b].scales[g] * y[b].bsums[g];
    isum = _mm256_sub_epi32(isum, _mm256_setr_epi32(32 * offset, 0, 0, 0, 0, 0, 0, 0));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16_to_fp32(x[b].d) * y[b].d), _mm256_cvtepi32_ps(isum),
                          acc);
  }
  return hsum(acc);
}

float dot_f32(const float* a, const float* b, int64_t n) {
  float s = 0;
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int k = 0; k < 4; ++k)
      acc[k] =
          _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8 * k), _mm256_loadu_ps(b + i + 8 * k), acc[k]);
  s = hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  a += i, b += i, n -= i;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

void axpy(float a, const float* x, float* y, int64_t n) {
  int64_t i = 0;
  const __m256 va = _mm256_set1_ps(a);
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += a * x[i];
}

float dot_f16(const uint16_t* a, const uint16_t* b, int64_t n) {
  float s = 0;
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int k = 0; k < 4; ++k) {
      __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i + 8 * k)));
      __m256 y = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i + 8 * k)));
      acc[k] = _mm256_fmadd_ps(x, y, acc[k]);
    }
  s = hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  a += i, b += i, n -= i;
  for (int64_t i = 0; i < n; ++i) s += fp16_to_fp32(a[i]) * fp16_to_fp32(b[i]);
  return s;
}

float dot_bf16(const uint16_t* a, const uint16_t* b, int64_t n) {
  float s = 0;
  // bf16 -> f32 is a 16-bit shift; four FMA chains as for F16.
  auto widen = [](const uint16_t* p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
  };
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int k = 0; k < 4; ++k)
      acc[k] = _mm256_fmadd_ps(widen(a + i + 8 * k), widen(b + i + 8 * k), acc[k]);
  s = hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  a += i, b += i, n -= i;
  for (int64_t i = 0; i < n; ++i) s += bf16_to_fp32(a[i]) * bf16_to_fp32(b[i]);
  return s;
}

// Q5_0 against Q8_0 activations: exact integer sums per block of 32, as ggml's reference does.
float dot_q5_0(const BlockQ5_0* x, const BlockQ8_0* y, int64_t n) {
  // The 32 fifth bits spread to bytes (0 or 16) with a shuffle and a bit mask, then as Q8_0.
  const __m256i shuf = _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101,
                                          0x0202020202020202, 0x0303030303030303);
  const __m256i bits = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
  const __m128i m4 = _mm_set1_epi8(0xF);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kQK8_0; ++b) {
    uint32_t qh;
    std::memcpy(&qh, x[b].qh, 4);
    const __m256i hb = _mm256_cmpeq_epi8(
        _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(qh)), shuf), bits),
        bits);
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x[b].qs));
    const __m256i lo4 =
        _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m4), _mm_and_si128(q, m4));
    const __m256i w = _mm256_sub_epi8(
        _mm256_or_si256(lo4, _mm256_and_si256(hb, _mm256_set1_epi8(16))), _mm256_set1_epi8(16));
    const __m256 d = _mm256_set1_ps(fp16_to_fp32(x[b].d) * fp16_to_fp32(y[b].d));
    acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(mul_sum_i8(w, load(y[b].qs))), acc);
  }
  return hsum(acc);
}

// MXFP4 against Q8_0 activations: integer sums of the doubled FP4 values per block of 32, scaled
// by the half E8M0 scale and the activations' scale (ggml's reference order).
float dot_mxfp4(const BlockMxfp4* x, const BlockQ8_0* y, int64_t n) {
  // The 16 FP4 codes map to int8 through one byte shuffle; products as for Q8_0 (sign trick).
  const __m128i table = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kMxfp4Doubled));
  const __m128i m4 = _mm_set1_epi8(0xF);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kQK8_0; ++b) {
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x[b].qs));
    const __m128i lo = _mm_shuffle_epi8(table, _mm_and_si128(q, m4));
    const __m128i hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(q, 4), m4));
    const __m256i w = _mm256_set_m128i(hi, lo);  // values 0..15 then 16..31
    const __m256 d = _mm256_set1_ps(std::ldexp(1.0f, int(x[b].e) - 128) * fp16_to_fp32(y[b].d));
    acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(mul_sum_i8(w, load(y[b].qs))), acc);
  }
  return hsum(acc);
}

float dot_q4_k(const BlockQ4K* x, const BlockQ8K* y, int64_t n) {
  return dot_k45<false>(reinterpret_cast<const uint8_t*>(x), sizeof(BlockQ4K), y, n);
}

float dot_q5_k(const BlockQ5K* x, const BlockQ8K* y, int64_t n) {
  return dot_k45<true>(reinterpret_cast<const uint8_t*>(x), sizeof(BlockQ5K), y, n);
}

void attend(const float* q, const float* k, const float* v, int64_t n_keys, int64_t k_stride,
            int64_t v_stride, int64_t dk, int64_t dv, float scale, float sink, float* s,
            float* out) {
  attend_with<dot_f32, axpy>(q, k, v, n_keys, k_stride, v_stride, dk, dv, scale, sink, s, out);
}

void quantize_q8_0(const float* x, BlockQ8_0* y, int64_t n) {
  quantize_q8_0_body(x, y, n);
}
void quantize_q8_k(const float* x, BlockQ8K* y, int64_t n) {
  quantize_q8_k_body(x, y, n);
}

}  // namespace kernels::avx2
