// The scalar reference kernels: the source of truth every instruction set is checked against
// (tests/kernels), written as ggml's reference code computes (same integer sums per block, same
// order of the float products), so that logits match llama.cpp's CPU backend.
#include <cmath>
#include <cstring>

#include "kernels/dequant.h"
#include "kernels/fp16.h"
#include "kernels/isa.h"
#include "kernels/quantize_acts.h"
#include "kernels/softmax.h"

namespace kernels::ref {

// --- Activations, quantized for the dots ---

void quantize_f32(const float* x, float* y, int64_t n) {
  std::memcpy(y, x, 4 * n);
}

void quantize_f16(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = fp32_to_fp16(x[i]);
}

void quantize_bf16(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = fp32_to_bf16(x[i]);
}

void quantize_q8_0(const float* x, BlockQ8_0* y, int64_t n) {
  quantize_q8_0_body(x, y, n);
}
void quantize_q8_k(const float* x, BlockQ8K* y, int64_t n) {
  quantize_q8_k_body(x, y, n);
}

float dot_f32(const float* a, const float* b, int64_t n) {
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

void axpy(float a, const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i < n; ++i) y[i] += a * x[i];
}

float dot_f32_f16(const float* a, const uint16_t* b, int64_t n) {
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += a[i] * fp16_to_fp32(b[i]);
  return s;
}

void axpy_f16(float a, const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * fp16_to_fp32(x[i]);
}

// out += w_j v_j over the rows, j in order (attend's values), for each query.
void wsum_f32(const float* w, int64_t w_stride, int G, const float* v, int64_t n, int64_t stride,
              float* out, int64_t out_stride, int64_t dv) {
  for (int g = 0; g < G; ++g)
    for (int64_t j = 0; j < n; ++j)
      axpy(w[g * w_stride + j], v + j * stride, out + g * out_stride, dv);
}

void wsum_f16(const float* w, int64_t w_stride, int G, const uint16_t* v, int64_t n, int64_t stride,
              float* out, int64_t out_stride, int64_t dv) {
  for (int g = 0; g < G; ++g)
    for (int64_t j = 0; j < n; ++j)
      axpy_f16(w[g * w_stride + j], v + j * stride, out + g * out_stride, dv);
}

void dots_f32(const float* q, int64_t q_stride, int G, const float* k, int64_t n_keys,
              int64_t k_stride, int64_t dk, float scale, float* s) {
  for (int g = 0; g < G; ++g)
    for (int64_t j = 0; j < n_keys; ++j)
      s[g * n_keys + j] = dot_f32(q + g * q_stride, k + j * k_stride, dk) * scale;
}

void dots_f16(const float* q, int64_t q_stride, int G, const uint16_t* k, int64_t n_keys,
              int64_t k_stride, int64_t dk, float scale, float* s) {
  for (int g = 0; g < G; ++g)
    for (int64_t j = 0; j < n_keys; ++j)
      s[g * n_keys + j] = dot_f32_f16(q + g * q_stride, k + j * k_stride, dk) * scale;
}

void softmax_scores(float* s, int64_t n, float sink) {
  float mx = sink;
  for (int64_t j = 0; j < n; ++j) mx = s[j] > mx ? s[j] : mx;
  double a[4] = {0, 0, 0, 0};
  for (int64_t j = 0; j < n; ++j) s[j] = attn_softmax::exp_score(s[j] - mx), a[j % 4] += s[j];
  double sum = (a[0] + a[1]) + (a[2] + a[3]);
  if (sink != -INFINITY) sum += attn_softmax::exp_score(sink - mx);
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t j = 0; j < n; ++j) s[j] *= inv;
}

void swiglu(const float* g, const float* u, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = g[i] / (1.0f + attn_softmax::exp_clamped(-g[i])) * u[i];
}

float dot_f16(const uint16_t* a, const uint16_t* b, int64_t n) {
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += fp16_to_fp32(a[i]) * fp16_to_fp32(b[i]);
  return s;
}

float dot_bf16(const uint16_t* a, const uint16_t* b, int64_t n) {
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += bf16_to_fp32(a[i]) * bf16_to_fp32(b[i]);
  return s;
}

float dot_q8_0(const BlockQ8_0* x, const BlockQ8_0* y, int64_t n) {
  float s = 0;
  for (int64_t b = 0; b < n / kQK8_0; ++b) {
    int sumi = 0;
    for (int i = 0; i < kQK8_0; ++i) sumi += x[b].qs[i] * y[b].qs[i];
    s += static_cast<float>(sumi) * (fp16_to_fp32(x[b].d) * fp16_to_fp32(y[b].d));
  }
  return s;
}

// Q5_0 against Q8_0 activations: exact integer sums per block of 32, as ggml's reference does.
float dot_q5_0(const BlockQ5_0* x, const BlockQ8_0* y, int64_t n) {
  float s = 0;
  for (int64_t b = 0; b < n / kQK8_0; ++b) {
    uint32_t qh;
    std::memcpy(&qh, x[b].qh, 4);
    int sumi = 0;
    for (int j = 0; j < kQK8_0 / 2; ++j) {
      const int lo = static_cast<int>((x[b].qs[j] & 0xF) | (((qh >> j) & 1) << 4)) - 16;
      const int hi = static_cast<int>((x[b].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16;
      sumi += lo * y[b].qs[j] + hi * y[b].qs[j + 16];
    }
    s += static_cast<float>(sumi) * (fp16_to_fp32(x[b].d) * fp16_to_fp32(y[b].d));
  }
  return s;
}

// MXFP4 against Q8_0 activations: integer sums of the doubled FP4 values per block of 32, scaled
// by the half E8M0 scale and the activations' scale (ggml's reference order).
float dot_mxfp4(const BlockMxfp4* x, const BlockQ8_0* y, int64_t n) {
  float s = 0;
  for (int64_t b = 0; b < n / kQK8_0; ++b) {
    int sumi = 0;
    for (int j = 0; j < 16; ++j)
      sumi += kMxfp4Doubled[x[b].qs[j] & 0xF] * y[b].qs[j] +
              kMxfp4Doubled[x[b].qs[j] >> 4] * y[b].qs[j + 16];
    s += static_cast<float>(sumi) * (e8m0_half(x[b].e) * fp16_to_fp32(y[b].d));
  }
  return s;
}

float dot_q4_k(const BlockQ4K* x, const BlockQ8K* y, int64_t n) {
  float s = 0;
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const uint8_t* q4 = x[b].qs;
    const int8_t* q8 = y[b].qs;
    int sumi = 0, summ = 0;
    for (int j = 0; j < 8; j += 2) {  // 64 weights: low nibbles then high nibbles of 32 bytes
      uint8_t sc0, m0, sc1, m1;
      k4_scale_min(j, x[b].scales, &sc0, &m0);
      k4_scale_min(j + 1, x[b].scales, &sc1, &m1);
      int s0 = 0, s1 = 0;
      for (int l = 0; l < 32; ++l) {
        s0 += (q4[l] & 0xF) * q8[l];
        s1 += (q4[l] >> 4) * q8[l + 32];
      }
      sumi += sc0 * s0 + sc1 * s1;
      summ += m0 * (y[b].bsums[2 * j] + y[b].bsums[2 * j + 1]) +
              m1 * (y[b].bsums[2 * j + 2] + y[b].bsums[2 * j + 3]);
      q4 += 32;
      q8 += 64;
    }
    s += fp16_to_fp32(x[b].d) * y[b].d * static_cast<float>(sumi) -
         fp16_to_fp32(x[b].dmin) * y[b].d * static_cast<float>(summ);
  }
  return s;
}

float dot_q5_k(const BlockQ5K* x, const BlockQ8K* y, int64_t n) {
  float s = 0;
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const uint8_t* ql = x[b].qs;
    const uint8_t* qh = x[b].qh;
    const int8_t* q8 = y[b].qs;
    int sumi = 0, summ = 0;
    uint8_t u1 = 1, u2 = 2;
    for (int j = 0; j < 8; j += 2) {
      uint8_t sc0, m0, sc1, m1;
      k4_scale_min(j, x[b].scales, &sc0, &m0);
      k4_scale_min(j + 1, x[b].scales, &sc1, &m1);
      int s0 = 0, s1 = 0;
      for (int l = 0; l < 32; ++l) {
        s0 += ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) * q8[l];
        s1 += ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) * q8[l + 32];
      }
      sumi += sc0 * s0 + sc1 * s1;
      summ += m0 * (y[b].bsums[2 * j] + y[b].bsums[2 * j + 1]) +
              m1 * (y[b].bsums[2 * j + 2] + y[b].bsums[2 * j + 3]);
      ql += 32;
      q8 += 64;
      u1 <<= 2;
      u2 <<= 2;
    }
    s += fp16_to_fp32(x[b].d) * y[b].d * static_cast<float>(sumi) -
         fp16_to_fp32(x[b].dmin) * y[b].d * static_cast<float>(summ);
  }
  return s;
}

float dot_q6_k(const BlockQ6K* x, const BlockQ8K* y, int64_t n) {
  float s = 0;
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const uint8_t* ql = x[b].ql;
    const uint8_t* qh = x[b].qh;
    const int8_t* sc = x[b].scales;
    const int8_t* q8 = y[b].qs;
    int sumi = 0;
    for (int half = 0; half < 2; ++half) {  // 128 weights each
      int s4[8] = {};
      for (int l = 0; l < 32; ++l) {
        int is = l / 16;
        int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        s4[is + 0] += q1 * q8[l];
        s4[is + 2] += q2 * q8[l + 32];
        s4[is + 4] += q3 * q8[l + 64];
        s4[is + 6] += q4 * q8[l + 96];
      }
      for (int g = 0; g < 8; ++g) sumi += sc[g] * s4[g];
      ql += 64;
      qh += 32;
      sc += 8;
      q8 += 128;
    }
    s += fp16_to_fp32(x[b].d) * y[b].d * static_cast<float>(sumi);
  }
  return s;
}

}  // namespace kernels::ref

// --- The types of the weight-types issue: llama.cpp's generic dots (ggml-cpu/quants.c), exact
// integer sums per block, then the float products in ggml's order ---

namespace kernels::ref {
namespace {
inline float h(uint16_t v) {
  return fp16_to_fp32(v);
}
inline int grid(uint64_t g, int j) {
  return int((g >> (8 * j)) & 0xFF);
}
inline int sgrid(uint64_t g, int j) {
  return int(int8_t((g >> (8 * j)) & 0xFF));
}
inline int sgn(uint8_t signs, int j) {
  return signs & (1u << j) ? -1 : 1;
}
// One IQ2 group of 8: sum of grid magnitudes x signs x activations.
inline int iq2_group(uint64_t g, uint8_t signs, const int8_t* q8) {
  int s = 0;
  for (int j = 0; j < 8; ++j) s += grid(g, j) * q8[j] * sgn(signs, j);
  return s;
}
}  // namespace

void quantize_q8_1(const float* x, BlockQ8_1* y, int64_t n) {
  quantize_q8_1_body(x, y, n);
}

float dot_q4_0(const BlockQ4_0* x, const BlockQ8_0* y, int64_t n) {
  float s = 0;
  for (int64_t b = 0; b < n / 32; ++b) {
    int sumi = 0;
    for (int j = 0; j < 16; ++j)
      sumi += ((x[b].qs[j] & 0xF) - 8) * y[b].qs[j] + ((x[b].qs[j] >> 4) - 8) * y[b].qs[j + 16];
    s += static_cast<float>(sumi) * (h(x[b].d) * h(y[b].d));
  }
  return s;
}

float dot_q4_1(const BlockQ4_1* x, const BlockQ8_1* y, int64_t n) {
  float s = 0;
  for (int64_t b = 0; b < n / 32; ++b) {
    int sumi = 0;
    for (int j = 0; j < 16; ++j)
      sumi += (x[b].qs[j] & 0xF) * y[b].qs[j] + (x[b].qs[j] >> 4) * y[b].qs[j + 16];
    s += (h(x[b].d) * h(y[b].d)) * static_cast<float>(sumi) + h(x[b].m) * h(y[b].s);
  }
  return s;
}

float dot_q5_1(const BlockQ5_1* x, const BlockQ8_1* y, int64_t n) {
  float s = 0;
  for (int64_t b = 0; b < n / 32; ++b) {
    uint32_t qh;
    std::memcpy(&qh, x[b].qh, 4);
    int sumi = 0;
    for (int j = 0; j < 16; ++j) {
      const int lo = (x[b].qs[j] & 0xF) | ((qh >> j) & 1) << 4;
      const int hi = (x[b].qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4;
      sumi += lo * y[b].qs[j] + hi * y[b].qs[j + 16];
    }
    s += (h(x[b].d) * h(y[b].d)) * static_cast<float>(sumi) + h(x[b].m) * h(y[b].s);
  }
  return s;
}

float dot_iq4_nl(const BlockIq4Nl* x, const BlockQ8_0* y, int64_t n) {
  float s = 0;
  for (int64_t b = 0; b < n / 32; ++b) {
    int sumi = 0;
    for (int j = 0; j < 16; ++j)
      sumi += y[b].qs[j] * iq::kvalues_iq4nl[x[b].qs[j] & 0xF] +
              y[b].qs[j + 16] * iq::kvalues_iq4nl[x[b].qs[j] >> 4];
    s += (h(y[b].d) * h(x[b].d)) * static_cast<float>(sumi);
  }
  return s;
}

float dot_nvfp4(const BlockNvfp4* x, const BlockQ8_0* y, int64_t n) {
  float s = 0;
  for (int64_t b = 0; b < n / 64; ++b)
    for (int sb = 0; sb < 4; ++sb) {
      const BlockQ8_0& yb = y[2 * b + sb / 2];
      const int8_t* q8 = yb.qs + (sb % 2) * 16;
      int sumi = 0;
      for (int j = 0; j < 8; ++j) {
        const uint8_t q = x[b].qs[8 * sb + j];
        sumi += q8[j] * kMxfp4Doubled[q & 0xF] + q8[j + 8] * kMxfp4Doubled[q >> 4];
      }
      s += (h(yb.d) * ue4m3_half(x[b].d[sb])) * static_cast<float>(sumi);
    }
  return s;
}

float dot_q1_0(const BlockQ1_0* x, const BlockQ8_0* y, int64_t n) {
  float s = 0;
  for (int64_t b = 0; b < n / 128; ++b) {
    float sumi = 0;
    for (int k = 0; k < 4; ++k) {
      const BlockQ8_0& yb = y[4 * b + k];
      int si = 0;
      for (int i = 0; i < 32; ++i)
        si += (x[b].qs[4 * k + i / 8] >> (i % 8)) & 1 ? yb.qs[i] : -yb.qs[i];
      sumi += h(yb.d) * static_cast<float>(si);
    }
    s += h(x[b].d) * sumi;
  }
  return s;
}

float dot_q2_0(const BlockQ2_0* x, const BlockQ8_0* y, int64_t n) {
  float s = 0;
  for (int64_t b = 0; b < n / 64; ++b) {
    float sumi = 0;
    for (int k = 0; k < 2; ++k) {
      const BlockQ8_0& yb = y[2 * b + k];
      int si = 0;
      for (int i = 0; i < 32; ++i)
        si += (int((x[b].qs[8 * k + i / 4] >> (2 * (i % 4))) & 3) - 1) * yb.qs[i];
      sumi += h(yb.d) * static_cast<float>(si);
    }
    s += h(x[b].d) * sumi;
  }
  return s;
}

float dot_q2_k(const BlockQ2K* x, const BlockQ8K* y, int64_t n) {
  float s = 0;
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const uint8_t* sc = x[b].scales;
    int summs = 0;
    for (int j = 0; j < 16; ++j) summs += y[b].bsums[j] * (sc[j] >> 4);
    int isum = 0;
    for (int k = 0; k < 8; ++k) {  // 32 values: 2-bit field k % 4 of bytes 32 (k / 4) ..
      const uint8_t* q2 = x[b].qs + 32 * (k / 4);
      const int8_t* q8 = y[b].qs + 32 * k;
      const int shift = 2 * (k % 4);
      int lo = 0, hi = 0;
      for (int l = 0; l < 16; ++l) {
        lo += q8[l] * ((q2[l] >> shift) & 3);
        hi += q8[l + 16] * ((q2[l + 16] >> shift) & 3);
      }
      isum += (sc[2 * k] & 0xF) * lo + (sc[2 * k + 1] & 0xF) * hi;
    }
    const float dall = y[b].d * h(x[b].d), dmin = y[b].d * h(x[b].dmin);
    s += dall * static_cast<float>(isum) - dmin * static_cast<float>(summs);
  }
  return s;
}

float dot_q3_k(const BlockQ3K* x, const BlockQ8K* y, int64_t n) {
  float s = 0;
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    int8_t scales[16];
    q3k_scales(x[b].scales, scales);
    int isum = 0;
    for (int k = 0; k < 8; ++k) {
      const uint8_t* q3 = x[b].qs + 32 * (k / 4);
      const int8_t* q8 = y[b].qs + 32 * k;
      const int shift = 2 * (k % 4);
      int part[2] = {0, 0};
      for (int i = 0; i < 32; ++i) {
        const int q = int((q3[i] >> shift) & 3) - ((x[b].hmask[i] >> k) & 1 ? 0 : 4);
        part[i / 16] += q * q8[i];
      }
      isum += (scales[2 * k] - 32) * part[0] + (scales[2 * k + 1] - 32) * part[1];
    }
    s += (h(x[b].d) * y[b].d) * static_cast<float>(isum);
  }
  return s;
}

float dot_tq1_0(const BlockTq1_0* x, const BlockQ8K* y, int64_t n) {
  static const uint8_t pow3[5] = {1, 3, 9, 27, 81};
  float s = 0;
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    int sum = 0;
    for (int e = 0; e < kQK_K; ++e) {
      uint8_t byte, p;
      if (e < 160) {
        byte = x[b].qs[e % 32], p = pow3[e / 32];
      } else if (e < 240) {
        byte = x[b].qs[32 + (e - 160) % 16], p = pow3[(e - 160) / 16];
      } else {
        byte = x[b].qh[(e - 240) % 4], p = pow3[(e - 240) / 4];
      }
      const uint8_t q = uint8_t(byte * p);
      sum += (int((uint16_t(q) * 3) >> 8) - 1) * y[b].qs[e];
    }
    s += static_cast<float>(sum) * (h(x[b].d) * y[b].d);
  }
  return s;
}

float dot_tq2_0(const BlockTq2_0* x, const BlockQ8K* y, int64_t n) {
  float s = 0;
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    int sumi = 0;
    for (int e = 0; e < kQK_K; ++e) {
      const int k = e / 32, i = e % 32;
      sumi += y[b].qs[e] * (int((x[b].qs[32 * (k / 4) + i] >> (2 * (k % 4))) & 3) - 1);
    }
    s += static_cast<float>(sumi) * (y[b].d * h(x[b].d));
  }
  return s;
}

float dot_iq2_xxs(const BlockIq2Xxs* x, const BlockQ8K* y, int64_t n) {
  float s = 0;
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const uint8_t* q = reinterpret_cast<const uint8_t*>(x[b].qs);
    const int8_t* q8 = y[b].qs;
    int bsum = 0;
    for (int ib = 0; ib < 8; ++ib, q += 8) {
      uint32_t aux;
      std::memcpy(&aux, q + 4, 4);
      int sumi = 0;
      for (int l = 0; l < 4; ++l, q8 += 8)
        sumi += iq2_group(iq::iq2xxs_grid[q[l]], iq::ksigns_iq2xs[(aux >> (7 * l)) & 127], q8);
      bsum += sumi * int(2 * (aux >> 28) + 1);
    }
    s += (h(x[b].d) * y[b].d) * static_cast<float>(bsum);
  }
  return 0.125f * s;
}

float dot_iq2_xs(const BlockIq2Xs* x, const BlockQ8K* y, int64_t n) {
  float s = 0;
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const int8_t* q8 = y[b].qs;
    int bsum = 0;
    for (int ib = 0; ib < 8; ++ib) {
      int sumi[2] = {0, 0};
      for (int l = 0; l < 4; ++l, q8 += 8) {
        const uint16_t q = x[b].qs[4 * ib + l];
        sumi[l / 2] += iq2_group(iq::iq2xs_grid[q & 511], iq::ksigns_iq2xs[q >> 9], q8);
      }
      bsum +=
          sumi[0] * (2 * (x[b].scales[ib] & 0xf) + 1) + sumi[1] * (2 * (x[b].scales[ib] >> 4) + 1);
    }
    s += (h(x[b].d) * y[b].d) * static_cast<float>(bsum);
  }
  return 0.125f * s;
}

float dot_iq2_s(const BlockIq2S* x, const BlockQ8K* y, int64_t n) {
  float s = 0;
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const int8_t* q8 = y[b].qs;
    int bsum = 0;
    for (int ib = 0; ib < 8; ++ib) {
      const uint8_t* qs = x[b].qs + 4 * ib;
      const uint8_t* signs = x[b].qs + 32 + 4 * ib;
      int sumi[2] = {0, 0};
      for (int l = 0; l < 4; ++l, q8 += 8)
        sumi[l / 2] +=
            iq2_group(iq::iq2s_grid[qs[l] | ((x[b].qh[ib] << (8 - 2 * l)) & 0x300)], signs[l], q8);
      bsum +=
          sumi[0] * (2 * (x[b].scales[ib] & 0xf) + 1) + sumi[1] * (2 * (x[b].scales[ib] >> 4) + 1);
    }
    s += (h(x[b].d) * y[b].d) * static_cast<float>(bsum);
  }
  return 0.125f * s;
}

float dot_iq3_xxs(const BlockIq3Xxs* x, const BlockQ8K* y, int64_t n) {
  float s = 0;
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const int8_t* q8 = y[b].qs;
    int bsum = 0;
    for (int ib = 0; ib < 8; ++ib) {
      const uint8_t* q3 = x[b].qs + 8 * ib;
      uint32_t aux;
      std::memcpy(&aux, x[b].qs + 64 + 4 * ib, 4);
      int sumi = 0;
      for (int l = 0; l < 4; ++l, q8 += 8) {
        const uint8_t signs = iq::ksigns_iq2xs[(aux >> (7 * l)) & 127];
        const uint32_t g1 = iq::iq3xxs_grid[q3[2 * l]], g2 = iq::iq3xxs_grid[q3[2 * l + 1]];
        for (int j = 0; j < 4; ++j)
          sumi += grid(g1, j) * q8[j] * sgn(signs, j) + grid(g2, j) * q8[j + 4] * sgn(signs, j + 4);
      }
      bsum += sumi * int(2 * (aux >> 28) + 1);
    }
    s += (h(x[b].d) * y[b].d) * static_cast<float>(bsum);
  }
  return 0.25f * s;
}

float dot_iq3_s(const BlockIq3S* x, const BlockQ8K* y, int64_t n) {
  float s = 0;
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const int8_t* q8 = y[b].qs;
    int bsum = 0;
    for (int ib = 0; ib < 8; ++ib) {
      const uint8_t* qs = x[b].qs + 8 * ib;
      const uint8_t* signs = x[b].signs + 4 * ib;
      const int qh = x[b].qh[ib];
      int sumi = 0;
      for (int l = 0; l < 4; ++l, q8 += 8) {
        const uint32_t g1 = iq::iq3s_grid[qs[2 * l] | ((qh << (8 - 2 * l)) & 256)];
        const uint32_t g2 = iq::iq3s_grid[qs[2 * l + 1] | ((qh << (7 - 2 * l)) & 256)];
        for (int j = 0; j < 4; ++j)
          sumi += grid(g1, j) * q8[j] * sgn(signs[l], j) +
                  grid(g2, j) * q8[j + 4] * sgn(signs[l], j + 4);
      }
      const int ls = ib % 2 ? x[b].scales[ib / 2] >> 4 : x[b].scales[ib / 2] & 0xf;
      bsum += sumi * (2 * ls + 1);
    }
    s += (h(x[b].d) * y[b].d) * static_cast<float>(bsum);
  }
  return s;
}

float dot_iq1_s(const BlockIq1S* x, const BlockQ8K* y, int64_t n) {
  float s = 0;
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const int8_t* q8 = y[b].qs;
    int sumi = 0, sumi1 = 0;
    for (int ib = 0; ib < 8; ++ib) {
      const uint16_t qh = x[b].qh[ib];
      const int ls = 2 * ((qh >> 12) & 7) + 1, delta = qh & 0x8000 ? -1 : 1;
      int lsum = 0;
      for (int l = 0; l < 4; ++l, q8 += 8) {
        const uint64_t g = iq::iq1s_grid[x[b].qs[4 * ib + l] | (((qh >> (3 * l)) & 7) << 8)];
        for (int j = 0; j < 8; ++j) lsum += q8[j] * sgrid(g, j);
      }
      sumi += ls * lsum;
      sumi1 += ls * delta * (y[b].bsums[2 * ib] + y[b].bsums[2 * ib + 1]);
    }
    s += h(x[b].d) * y[b].d * (static_cast<float>(sumi) + kIq1Delta * static_cast<float>(sumi1));
  }
  return s;
}

float dot_iq1_m(const BlockIq1M* x, const BlockQ8K* y, int64_t n) {
  float s = 0;
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const int8_t* q8 = y[b].qs;
    int sumi1 = 0, sumi2 = 0;
    for (int ib = 0; ib < 8; ++ib) {
      const uint8_t* qs = x[b].qs + 4 * ib;
      const uint8_t* qh = x[b].qh + 2 * ib;
      const uint16_t sc = uint16_t(x[b].scales[2 * (ib / 2)] | x[b].scales[2 * (ib / 2) + 1] << 8);
      int sum1[2] = {0, 0}, sum2[2] = {0, 0};
      for (int l = 0; l < 4; ++l, q8 += 8) {
        const int hb = qh[l / 2] >> (4 * (l % 2));
        const uint64_t g = iq::iq1s_grid[qs[l] | ((hb & 7) << 8)];
        int lsum1 = 0, lsum2 = 0;
        for (int j = 0; j < 8; ++j) lsum1 += q8[j] * sgrid(g, j), lsum2 += q8[j];
        sum1[l / 2] += lsum1;
        sum2[l / 2] += lsum2 * (hb & 0x08 ? -1 : 1);
      }
      const int ls1 = 2 * ((sc >> (6 * (ib % 2) + 0)) & 0x7) + 1;
      const int ls2 = 2 * ((sc >> (6 * (ib % 2) + 3)) & 0x7) + 1;
      sumi1 += sum1[0] * ls1 + sum1[1] * ls2;
      sumi2 += sum2[0] * ls1 + sum2[1] * ls2;
    }
    s += h(iq1m_scale_bits(x[b].scales)) * y[b].d *
         (static_cast<float>(sumi1) + kIq1Delta * static_cast<float>(sumi2));
  }
  return s;
}

float dot_iq4_xs(const BlockIq4Xs* x, const BlockQ8K* y, int64_t n) {
  float s = 0;
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const int8_t* q8 = y[b].qs;
    int isum = 0;
    for (int ib = 0; ib < 8; ++ib, q8 += 32) {
      const uint8_t* qs = x[b].qs + 16 * ib;
      const int ls = ((x[b].scales_l[ib / 2] >> (4 * (ib % 2))) & 0xf) |
                     (((x[b].scales_h >> (2 * ib)) & 3) << 4);
      int sumi = 0;
      for (int j = 0; j < 16; ++j)
        sumi += q8[j] * iq::kvalues_iq4nl[qs[j] & 0xf] + q8[j + 16] * iq::kvalues_iq4nl[qs[j] >> 4];
      isum += (ls - 32) * sumi;
    }
    s += (h(x[b].d) * y[b].d) * static_cast<float>(isum);
  }
  return s;
}

}  // namespace kernels::ref
