// The AVX2 + FMA + F16C kernels (compile flags in CMakeLists.txt): exact integer sums per block
// (maddubs/madd), scaled and accumulated in eight float lanes with FMA across blocks, one
// horizontal sum per row (as llama.cpp does). What has no AVX2 body here runs the reference.
#include "kernels/avx2.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "kernels/fp16.h"
#include "kernels/isa.h"
#include "kernels/kernels.h"
#include "kernels/softmax.h"
#include "kernels/x86.h"

namespace kernels::avx2 {

// Q8_0 and MXFP4: x86.h's block body (each block's exact sum, then eight float lanes), its
// 4-element sums from vpmaddubsw + vpmaddwd (no saturation: |w| <= 128, |y| <= 127).
struct DotMaddubs {
  static __m256i dot(__m256i aw, __m256i sy) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sy), _mm256_set1_epi16(1));
  }
};
template <int N>
void q8_0_rows(const BlockQ8_0* x, const BlockQ8_0* const* ys, int64_t n, float* out) {
  x86::tile_b32<DotMaddubs, x86::Q8_0Values, BlockQ8_0, N>(x, ys, n, out);
}
template <int N>
void mxfp4_rows(const BlockMxfp4* x, const BlockQ8_0* const* ys, int64_t n, float* out) {
  x86::tile_b32<DotMaddubs, x86::Mxfp4Values, BlockMxfp4, N>(x, ys, n, out);
}
EXPERTD_ROWS_KERNEL(q8_0, BlockQ8_0, BlockQ8_0, q8_0_rows)
EXPERTD_ROWS_KERNEL(mxfp4, BlockMxfp4, BlockQ8_0, mxfp4_rows)

// Q4_K and Q5_K share everything but the fifth bit: the scales as i16 madd multipliers from one
// shuffle, the mins against the activations' 16-element sums; each super-block's exact sums go
// to the lanes of sb_lanes (avx2.h), which the matrix-matrix panels reproduce. N tokens share
// each decoded weight block (N = 1: the dot; 2..4: the tile, whose every token gets exactly the
// dot's arithmetic).
template <bool kFive, int N>
void k45_rows(const uint8_t* blocks, size_t stride, const BlockQ8K* const* ys, int64_t n,
              float* out) {
  const __m256i low4 = _mm256_set1_epi8(0xF), one = _mm256_set1_epi8(1);
  // Group k's scale (i16 word k of each lane, words 0..7 = the 8 scales) in every word.
  alignas(32) static const uint8_t kShuf[8][32] = {
#define EXPERTD_W(k) 2 * k, 2 * k + 1
#define EXPERTD_ROW(k)                                                                 \
  {EXPERTD_W(k), EXPERTD_W(k), EXPERTD_W(k), EXPERTD_W(k), EXPERTD_W(k), EXPERTD_W(k), \
   EXPERTD_W(k), EXPERTD_W(k), EXPERTD_W(k), EXPERTD_W(k), EXPERTD_W(k), EXPERTD_W(k), \
   EXPERTD_W(k), EXPERTD_W(k), EXPERTD_W(k), EXPERTD_W(k)}
      EXPERTD_ROW(0), EXPERTD_ROW(1), EXPERTD_ROW(2), EXPERTD_ROW(3),
      EXPERTD_ROW(4), EXPERTD_ROW(5), EXPERTD_ROW(6), EXPERTD_ROW(7)};
#undef EXPERTD_ROW
#undef EXPERTD_W
  sb_rows<N, true>(blocks, stride, 0, 2, n, ys, 1.0f, out, [&](int64_t b, __m256i* I, __m256i* M) {
    const uint8_t* blk = blocks + b * stride;
    const uint8_t* qh = kFive ? blk + 16 : nullptr;
    const uint8_t* q4 = kFive ? blk + 48 : blk + 16;
    uint8_t sm[16];
    k_scales_mins(blk + 4, sm);
    const __m128i sc128 = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sm)));
    const __m256i scales = _mm256_set_m128i(sc128, sc128);
    const __m128i m8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sm + 8));
    const __m256i mins_dup = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));  // m0 m0 .. m7 m7
    const __m256i hbits = kFive ? load(qh) : _mm256_setzero_si256();
    for (int t = 0; t < N; ++t) M[t] = _mm256_madd_epi16(mins_dup, load(ys[t][b].bsums));
    for (int j = 0; j < 4; ++j) {
      const __m256i sl = _mm256_shuffle_epi8(scales, load(kShuf[2 * j]));
      const __m256i sh = _mm256_shuffle_epi8(scales, load(kShuf[2 * j + 1]));
      const __m256i q = load(q4 + 32 * j);
      __m256i lo = _mm256_and_si256(q, low4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
      if (kFive) {
        lo = _mm256_or_si256(
            lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 2 * j), one), 4));
        hi = _mm256_or_si256(
            hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 2 * j + 1), one), 4));
      }
      for (int t = 0; t < N; ++t) {
        const int8_t* q8 = ys[t][b].qs + 64 * j;
        const __m256i pl = _mm256_madd_epi16(sl, _mm256_maddubs_epi16(lo, load(q8)));
        const __m256i ph = _mm256_madd_epi16(sh, _mm256_maddubs_epi16(hi, load(q8 + 32)));
        I[t] = _mm256_add_epi32(I[t], _mm256_add_epi32(pl, ph));
      }
    }
  });
}
template <bool kFive>
float dot_k45(const uint8_t* blocks, size_t stride, const BlockQ8K* y, int64_t n) {
  float out;
  k45_rows<kFive, 1>(blocks, stride, &y, n, &out);
  return out;
}

// a . b over the 32-float steps into four 8-float FMA accumulators; returns the floats done.
static int64_t dot_steps(const float* a, const float* b, int64_t n, __m256 acc[4]) {
  for (int k = 0; k < 4; ++k) acc[k] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int k = 0; k < 4; ++k)
      acc[k] =
          _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8 * k), _mm256_loadu_ps(b + i + 8 * k), acc[k]);
  return i;
}

float dot_f32(const float* a, const float* b, int64_t n) {
  __m256 acc[4];
  const int64_t i = dot_steps(a, b, n, acc);
  float s = hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  a += i, b += i, n -= i;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

float dot_f32_ggml(const float* a, const float* b, int64_t n) {
  __m256 acc[4];
  int64_t i = dot_steps(a, b, n, acc);
  acc[0] = _mm256_add_ps(acc[0], acc[2]), acc[1] = _mm256_add_ps(acc[1], acc[3]);
  acc[0] = _mm256_add_ps(acc[0], acc[1]);
  const __m128 t0 = _mm_add_ps(_mm256_castps256_ps128(acc[0]), _mm256_extractf128_ps(acc[0], 1));
  const __m128 t1 = _mm_hadd_ps(t0, t0);
  float s = _mm_cvtss_f32(_mm_hadd_ps(t1, t1));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

void axpy_ggml(float a, const float* x, float* y, int64_t n) {
  int64_t i = 0;
  const __m256 va = _mm256_set1_ps(a);
  for (; i + 32 <= n; i += 32)
    for (int k = 0; k < 4; ++k)
      _mm256_storeu_ps(y + i + 8 * k, _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8 * k), va,
                                                      _mm256_loadu_ps(y + i + 8 * k)));
  for (; i < n; ++i) y[i] += x[i] * a;
}

void axpy(float a, const float* x, float* y, int64_t n) {
  int64_t i = 0;
  const __m256 va = _mm256_set1_ps(a);
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += a * x[i];
}

// dot_f32 and axpy with b (x) widened from F16 as it is loaded: the same steps, the same sums.
float dot_f32_f16(const float* a, const uint16_t* b, int64_t n) {
  __m256 acc[4];
  for (int k = 0; k < 4; ++k) acc[k] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int k = 0; k < 4; ++k)
      acc[k] = _mm256_fmadd_ps(
          _mm256_loadu_ps(a + i + 8 * k),
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i + 8 * k))),
          acc[k]);
  float s = hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  for (; i < n; ++i) s += a[i] * fp16_to_fp32(b[i]);
  return s;
}

void axpy_f16(float a, const uint16_t* x, float* y, int64_t n) {
  int64_t i = 0;
  const __m256 va = _mm256_set1_ps(a);
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(
        y + i, _mm256_fmadd_ps(
                   va, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i))),
                   _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += a * fp16_to_fp32(x[i]);
}

// out += w_j v_j over the rows, j in order, with out's floats held in registers across the rows
// (64 at a time): each step is axpy's (one FMA per float, the tail's multiply-then-add), so the
// result is axpy's, bit for bit, without loading and storing out once per row.
static inline __m256 load8(const float* p) {
  return _mm256_loadu_ps(p);
}
static inline __m256 load8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
static inline float widen1(float x) {
  return x;
}
static inline float widen1(uint16_t x) {
  return fp16_to_fp32(x);
}
template <typename Elem>
static void wsum_body(const float* w, const Elem* v, int64_t n, int64_t stride, float* out,
                      int64_t dv) {
  int64_t i = 0;
  for (; i + 64 <= dv; i += 64) {
    __m256 acc[8];
    for (int k = 0; k < 8; ++k) acc[k] = _mm256_loadu_ps(out + i + 8 * k);
    for (int64_t j = 0; j < n; ++j) {
      const __m256 a = _mm256_set1_ps(w[j]);
      const Elem* vj = v + j * stride + i;
      for (int k = 0; k < 8; ++k) acc[k] = _mm256_fmadd_ps(a, load8(vj + 8 * k), acc[k]);
    }
    for (int k = 0; k < 8; ++k) _mm256_storeu_ps(out + i + 8 * k, acc[k]);
  }
  for (; i + 8 <= dv; i += 8) {
    __m256 acc = _mm256_loadu_ps(out + i);
    for (int64_t j = 0; j < n; ++j)
      acc = _mm256_fmadd_ps(_mm256_set1_ps(w[j]), load8(v + j * stride + i), acc);
    _mm256_storeu_ps(out + i, acc);
  }
  for (; i < dv; ++i) {
    float o = out[i];
    for (int64_t j = 0; j < n; ++j) o += w[j] * widen1(v[j * stride + i]);
    out[i] = o;
  }
}

// Two queries at once over 32 floats of out each: each load of a value row serves both (the
// floats past the last multiple of 32 go to wsum_body, one query at a time; every float's steps
// are the same either way: FMAs below dv's last multiple of 8, multiply-then-add past it).
template <typename Elem>
static void wsum_group(const float* w, int64_t w_stride, int G, const Elem* v, int64_t n,
                       int64_t stride, float* out, int64_t out_stride, int64_t dv) {
  const int64_t d32 = dv & ~int64_t{31};
  int g = 0;
  for (; g + 2 <= G; g += 2) {
    const float* w0 = w + g * w_stride;
    const float* w1 = w0 + w_stride;
    float* o0 = out + g * out_stride;
    float* o1 = o0 + out_stride;
    for (int64_t i = 0; i < d32; i += 32) {
      __m256 x[4], y[4];
      for (int k = 0; k < 4; ++k)
        x[k] = _mm256_loadu_ps(o0 + i + 8 * k), y[k] = _mm256_loadu_ps(o1 + i + 8 * k);
      for (int64_t j = 0; j < n; ++j) {
        const __m256 a = _mm256_set1_ps(w0[j]), b = _mm256_set1_ps(w1[j]);
        const Elem* vj = v + j * stride + i;
        for (int k = 0; k < 4; ++k) {
          const __m256 vk = load8(vj + 8 * k);
          x[k] = _mm256_fmadd_ps(a, vk, x[k]);
          y[k] = _mm256_fmadd_ps(b, vk, y[k]);
        }
      }
      for (int k = 0; k < 4; ++k)
        _mm256_storeu_ps(o0 + i + 8 * k, x[k]), _mm256_storeu_ps(o1 + i + 8 * k, y[k]);
    }
    if (d32 < dv) {
      wsum_body(w0, v + d32, n, stride, o0 + d32, dv - d32);
      wsum_body(w1, v + d32, n, stride, o1 + d32, dv - d32);
    }
  }
  if (g < G) wsum_body(w + g * w_stride, v, n, stride, out + g * out_stride, dv);
}

void wsum_f32(const float* w, int64_t w_stride, int G, const float* v, int64_t n, int64_t stride,
              float* out, int64_t out_stride, int64_t dv) {
  wsum_group(w, w_stride, G, v, n, stride, out, out_stride, dv);
}

void wsum_f16(const float* w, int64_t w_stride, int G, const uint16_t* v, int64_t n, int64_t stride,
              float* out, int64_t out_stride, int64_t dv) {
  wsum_group(w, w_stride, G, v, n, stride, out, out_stride, dv);
}

// Attention's scores, each pair's steps dot_steps's and its sum dot_f32's (the four accumulators
// added in pairs, hsum, then the tail one product at a time): two queries share each load of a
// key, and no call is made per pair (three or four at once measured slower: registers spill).
template <typename Elem>
static void dots_body(const float* q, int64_t q_stride, int G, const Elem* k, int64_t n_keys,
                      int64_t k_stride, int64_t dk, float scale, float* s) {
  const int64_t n32 = dk & ~int64_t{31};
  auto sum = [](const __m256* acc) {
    return hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  };
  for (int64_t j = 0; j < n_keys; ++j) {
    const Elem* kj = k + j * k_stride;
    int g = 0;
    for (; g + 2 <= G; g += 2) {
      const float* a = q + g * q_stride;
      const float* b = a + q_stride;
      __m256 x[4], y[4];
      for (int c = 0; c < 4; ++c) x[c] = y[c] = _mm256_setzero_ps();
      for (int64_t i = 0; i < n32; i += 32)
        for (int c = 0; c < 4; ++c) {
          const __m256 kv = load8(kj + i + 8 * c);
          x[c] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8 * c), kv, x[c]);
          y[c] = _mm256_fmadd_ps(_mm256_loadu_ps(b + i + 8 * c), kv, y[c]);
        }
      float sx = sum(x), sy = sum(y);
      for (int64_t i = n32; i < dk; ++i) sx += a[i] * widen1(kj[i]);
      for (int64_t i = n32; i < dk; ++i) sy += b[i] * widen1(kj[i]);
      s[g * n_keys + j] = sx * scale;
      s[(g + 1) * n_keys + j] = sy * scale;
    }
    if (g < G) {
      const float* a = q + g * q_stride;
      __m256 x[4];
      for (int c = 0; c < 4; ++c) x[c] = _mm256_setzero_ps();
      for (int64_t i = 0; i < n32; i += 32)
        for (int c = 0; c < 4; ++c)
          x[c] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8 * c), load8(kj + i + 8 * c), x[c]);
      float sx = sum(x);
      for (int64_t i = n32; i < dk; ++i) sx += a[i] * widen1(kj[i]);
      s[g * n_keys + j] = sx * scale;
    }
  }
}

void dots_f32(const float* q, int64_t q_stride, int G, const float* k, int64_t n_keys,
              int64_t k_stride, int64_t dk, float scale, float* s) {
  dots_body(q, q_stride, G, k, n_keys, k_stride, dk, scale, s);
}

void dots_f16(const float* q, int64_t q_stride, int G, const uint16_t* k, int64_t n_keys,
              int64_t k_stride, int64_t dk, float scale, float* s) {
  dots_body(q, q_stride, G, k, n_keys, k_stride, dk, scale, s);
}

// softmax.h's steps of exp on eight values (x already in [kFloor, kCeil], or masked after).
static inline __m256 exp_steps8(__m256 x) {
  using namespace attn_softmax;
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kLn2Hi), x);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kTaylor[7]);
  for (int i = 6; i >= 0; --i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kTaylor[i]));
  const __m256i two_n =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(two_n));
}

// softmax.h's exp_score on eight scores.
static inline __m256 exp_scores8(__m256 x) {
  const __m256 e = exp_steps8(x);
  return _mm256_and_ps(e, _mm256_cmp_ps(x, _mm256_set1_ps(attn_softmax::kFloor), _CMP_GE_OQ));
}

void swiglu(const float* g, const float* u, float* out, int64_t n) {
  using namespace attn_softmax;
  const __m256 lo = _mm256_set1_ps(kFloor), hi = _mm256_set1_ps(kCeil), one = _mm256_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(g + i);
    const __m256 m = _mm256_min_ps(hi, _mm256_max_ps(lo, _mm256_xor_ps(x, _mm256_set1_ps(-0.0f))));
    const __m256 e = exp_steps8(m);
    _mm256_storeu_ps(
        out + i, _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(one, e)), _mm256_loadu_ps(u + i)));
  }
  for (; i < n; ++i) out[i] = g[i] / (1.0f + exp_clamped(-g[i])) * u[i];
}

void softmax_scores(float* s, int64_t n, float sink) {
  const int64_t n8 = n & ~int64_t{7};
  __m256 m8 = _mm256_set1_ps(sink);
  for (int64_t j = 0; j < n8; j += 8) m8 = _mm256_max_ps(m8, _mm256_loadu_ps(s + j));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m8);
  float mx = sink;
  for (const float x : lanes) mx = x > mx ? x : mx;
  for (int64_t j = n8; j < n; ++j) mx = s[j] > mx ? s[j] : mx;
  const __m256 vmx = _mm256_set1_ps(mx);
  __m256d acc = _mm256_setzero_pd();  // lane l: the scores j = l (mod 4), in order
  for (int64_t j = 0; j < n8; j += 8) {
    const __m256 e = exp_scores8(_mm256_sub_ps(_mm256_loadu_ps(s + j), vmx));
    _mm256_storeu_ps(s + j, e);
    acc = _mm256_add_pd(acc, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    acc = _mm256_add_pd(acc, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
  }
  alignas(32) double a[4];
  _mm256_store_pd(a, acc);
  for (int64_t j = n8; j < n; ++j) s[j] = attn_softmax::exp_score(s[j] - mx), a[j % 4] += s[j];
  double sum = (a[0] + a[1]) + (a[2] + a[3]);
  if (sink != -INFINITY) sum += attn_softmax::exp_score(sink - mx);
  const float inv = static_cast<float>(1.0 / sum);
  const __m256 vinv = _mm256_set1_ps(inv);
  for (int64_t j = 0; j < n8; j += 8)
    _mm256_storeu_ps(s + j, _mm256_mul_ps(_mm256_loadu_ps(s + j), vinv));
  for (int64_t j = n8; j < n; ++j) s[j] *= inv;
}

float dot_f16(const uint16_t* a, const uint16_t* b, int64_t n) {
  float s = 0;
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    x86::prefetch_ahead(a + i);
    for (int k = 0; k < 4; ++k) {
      __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i + 8 * k)));
      __m256 y = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i + 8 * k)));
      acc[k] = _mm256_fmadd_ps(x, y, acc[k]);
    }
  }
  s = hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  a += i, b += i, n -= i;
  for (int64_t i = 0; i < n; ++i) s += fp16_to_fp32(a[i]) * fp16_to_fp32(b[i]);
  return s;
}

float dot_bf16(const uint16_t* a, const uint16_t* b, int64_t n) {
  // bf16 -> f32 is a 16-bit shift, and no shuffle is needed: a 32-bit word of two bf16 holds the
  // even element as f32 once shifted left by 16 and the odd one once its low half is cleared. 32
  // elements a step, each 16 in two chains, even and odd: chain 2c lane l sums elements
  // 32j + 16c + 2l, chain 2c + 1 the element after it (avx512.cpp's dot_bf16 gives the same bits).
  const __m256i hi = _mm256_set1_epi32(int(0xFFFF0000u));
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    x86::prefetch_ahead(a + i);
    for (int c = 0; c < 2; ++c) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + i + 16 * c));
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + i + 16 * c));
      acc[2 * c] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(w, 16)),
                                   _mm256_castsi256_ps(_mm256_slli_epi32(x, 16)), acc[2 * c]);
      acc[2 * c + 1] =
          _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(w, hi)),
                          _mm256_castsi256_ps(_mm256_and_si256(x, hi)), acc[2 * c + 1]);
    }
  }
  float s = hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  for (; i < n; ++i) s += bf16_to_fp32(a[i]) * bf16_to_fp32(b[i]);
  return s;
}

// Q5_0 against Q8_0 activations: exact integer sums per block of 32, as ggml's reference does.
float dot_q5_0(const BlockQ5_0* x, const BlockQ8_0* y, int64_t n) {
  // The 32 fifth bits spread to bytes (0 or 16) with a shuffle and a bit mask, then as Q8_0.
  const __m128i m4 = _mm_set1_epi8(0xF);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kQK8_0; ++b) {
    uint32_t qh;
    std::memcpy(&qh, x[b].qh, 4);
    const __m256i hb = x86::bytes_where_set(qh);
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

float dot_q4_k(const BlockQ4K* x, const BlockQ8K* y, int64_t n) {
  return dot_k45<false>(reinterpret_cast<const uint8_t*>(x), sizeof(BlockQ4K), y, n);
}

float dot_q5_k(const BlockQ5K* x, const BlockQ8K* y, int64_t n) {
  return dot_k45<true>(reinterpret_cast<const uint8_t*>(x), sizeof(BlockQ5K), y, n);
}

// The activations' quantizers, 8 floats a step: quantize_acts.h's arithmetic (its products, its
// round-half-even, its clamp), so the reference's bytes (what the compiler made of that source
// ran at ~2.3 ns an element for Q8_0: nearbyint stayed a call).
namespace {
float max_abs(const __m256* v, int k) {
  const __m256 mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 m = _mm256_setzero_ps();
  for (int i = 0; i < k; ++i) m = _mm256_max_ps(m, _mm256_and_ps(v[i], mask));
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
}
// 32 i32 values (all within int8) as 32 bytes in order.
__m256i pack_bytes(const __m256i* q) {
  const __m256i p =
      _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
  return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}
}  // namespace

void quantize_q8_0(const float* x, BlockQ8_0* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK8_0; ++b, x += kQK8_0) {
    __m256 v[4];
    for (int k = 0; k < 4; ++k) v[k] = _mm256_loadu_ps(x + 8 * k);
    const float amax = max_abs(v, 4);
    const float d = amax / 127.f;
    const __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.f / amax : 0.0f);
    y[b].d = fp32_to_fp16(d);
    __m256i q[4];  // cvtps rounds half to even (the default MXCSR), as nearbyint does
    for (int k = 0; k < 4; ++k) q[k] = _mm256_cvtps_epi32(_mm256_mul_ps(v[k], id));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y[b].qs), pack_bytes(q));
  }
}

void quantize_q8_k(const float* x, BlockQ8K* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b, x += kQK_K) {
    __m256 v[kQK_K / 8];
    for (int k = 0; k < kQK_K / 8; ++k) v[k] = _mm256_loadu_ps(x + 8 * k);
    const float amax = max_abs(v, kQK_K / 8);
    if (amax == 0) {
      std::memset(&y[b], 0, sizeof y[b]);
      continue;
    }
    // The signed value of the first element of magnitude amax (the reference keeps the first).
    const __m256 mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    float max = 0;
    for (int k = 0; k < kQK_K / 8; ++k) {
      const int hit = _mm256_movemask_ps(
          _mm256_cmp_ps(_mm256_and_ps(v[k], mask), _mm256_set1_ps(amax), _CMP_EQ_OQ));
      if (hit) {
        max = x[8 * k + __builtin_ctz(unsigned(hit))];
        break;
      }
    }
    const float iscale = -127.f / max;
    const __m256 s = _mm256_set1_ps(iscale), magic = _mm256_set1_ps(12582912.f);
    for (int j = 0; j < kQK_K; j += 32) {
      __m256i q[4];  // nearest_int(iscale * x), at most 127
      for (int k = 0; k < 4; ++k) {
        const __m256i bits =
            _mm256_castps_si256(_mm256_add_ps(_mm256_mul_ps(s, v[j / 8 + k]), magic));
        q[k] =
            _mm256_min_epi32(_mm256_sub_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(0x007fffff)),
                                              _mm256_set1_epi32(0x00400000)),
                             _mm256_set1_epi32(127));
      }
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y[b].qs + j), pack_bytes(q));
      for (int h = 0; h < 2; ++h)
        y[b].bsums[j / 16 + h] =
            static_cast<int16_t>(x86::hsum_i32(_mm256_add_epi32(q[2 * h], q[2 * h + 1])));
    }
    y[b].d = 1 / iscale;
  }
}

void tile_q4_k(const BlockQ4K* x, const BlockQ8K* const* ys, int n_tok, int64_t n, float* out) {
  with_n(n_tok, [&](auto N) {
    k45_rows<false, N>(reinterpret_cast<const uint8_t*>(x), sizeof(BlockQ4K), ys, n, out);
  });
}
void tile_q5_k(const BlockQ5K* x, const BlockQ8K* const* ys, int n_tok, int64_t n, float* out) {
  with_n(n_tok, [&](auto N) {
    k45_rows<true, N>(reinterpret_cast<const uint8_t*>(x), sizeof(BlockQ5K), ys, n, out);
  });
}

}  // namespace kernels::avx2
