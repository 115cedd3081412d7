// The scalar reference kernels: the source of truth every instruction set is checked against
// (tests/kernels), written as ggml's reference code computes (same integer sums per block, same
// order of the float products), so that logits match llama.cpp's CPU backend.
#include <cmath>
#include <cstring>

#include "kernels/attend.h"
#include "kernels/fp16.h"
#include "kernels/isa.h"
#include "kernels/quantize_acts.h"

namespace kernels::ref {

// --- Dequantization (one row of n elements) ---

void dequantize_f32(const float* s, float* y, int64_t n) {
  std::memcpy(y, s, 4 * n);
}

void dequantize_f16(const uint16_t* s, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = fp16_to_fp32(s[i]);
}

void dequantize_bf16(const uint16_t* s, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_fp32(s[i]);
}

void dequantize_q8_0(const BlockQ8_0* b, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK8_0; ++i)
    for (int j = 0; j < kQK8_0; ++j) y[i * kQK8_0 + j] = fp16_to_fp32(b[i].d) * b[i].qs[j];
}

void dequantize_q5_0(const BlockQ5_0* b, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    uint32_t qh;
    std::memcpy(&qh, b[i].qh, 4);
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < kQK8_0 / 2; ++j) {
      y[i * kQK8_0 + j] = d * (static_cast<int>((b[i].qs[j] & 0xF) | (((qh >> j) & 1) << 4)) - 16);
      y[i * kQK8_0 + j + 16] =
          d * (static_cast<int>((b[i].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16);
    }
  }
}

void dequantize_mxfp4(const BlockMxfp4* b, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    const float d = std::ldexp(1.0f, int(b[i].e) - 128);
    for (int j = 0; j < 16; ++j) {
      y[i * kQK8_0 + j] = d * kMxfp4Doubled[b[i].qs[j] & 0xF];
      y[i * kQK8_0 + j + 16] = d * kMxfp4Doubled[b[i].qs[j] >> 4];
    }
  }
}

namespace {
// Q4_K and Q5_K: 8 sub-blocks of 32, value = d * scale * q - dmin * min; Q5_K adds a fifth bit.
void dequantize_k45(const uint8_t* scales, const uint8_t* ql, const uint8_t* qh, uint16_t hd,
                    uint16_t hm, float* y) {
  const float d = fp16_to_fp32(hd), dmin = fp16_to_fp32(hm);
  uint8_t u1 = 1, u2 = 2;
  for (int j = 0; j < 8; j += 2) {
    uint8_t sc[2], m[2];
    k4_scale_min(j, scales, &sc[0], &m[0]);
    k4_scale_min(j + 1, scales, &sc[1], &m[1]);
    for (int l = 0; l < 32; ++l) {
      int lo = ql[l] & 0xF, hi = ql[l] >> 4;
      if (qh) lo += (qh[l] & u1) ? 16 : 0, hi += (qh[l] & u2) ? 16 : 0;
      y[j * 32 + l] = d * sc[0] * lo - dmin * m[0];
      y[j * 32 + 32 + l] = d * sc[1] * hi - dmin * m[1];
    }
    ql += 32;
    u1 <<= 2;
    u2 <<= 2;
  }
}
}  // namespace

void dequantize_q4_k(const BlockQ4K* b, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i)
    dequantize_k45(b[i].scales, b[i].qs, nullptr, b[i].d, b[i].dmin, y + i * kQK_K);
}

void dequantize_q5_k(const BlockQ5K* b, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i)
    dequantize_k45(b[i].scales, b[i].qs, b[i].qh, b[i].d, b[i].dmin, y + i * kQK_K);
}

void dequantize_q6_k(const BlockQ6K* blocks, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    auto& b = blocks[i];
    const float d = fp16_to_fp32(b.d);
    const uint8_t* ql = b.ql;
    const uint8_t* qh = b.qh;
    const int8_t* sc = b.scales;
    float* out = y + i * kQK_K;
    for (int half = 0; half < 2; ++half) {
      for (int l = 0; l < 32; ++l) {
        int is = l / 16;
        out[l] = d * sc[is] * (((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
        out[l + 32] = d * sc[is + 2] * (((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
        out[l + 64] = d * sc[is + 4] * (((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
        out[l + 96] = d * sc[is + 6] * (((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
      }
      out += 128, ql += 64, qh += 32, sc += 8;
    }
  }
}

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
    s += static_cast<float>(sumi) * (std::ldexp(1.0f, int(x[b].e) - 128) * fp16_to_fp32(y[b].d));
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

void attend(const float* q, const float* k, const float* v, int64_t n_keys, int64_t k_stride,
            int64_t v_stride, int64_t dk, int64_t dv, float scale, float sink, float* s,
            float* out) {
  attend_with<dot_f32, axpy>(q, k, v, n_keys, k_stride, v_stride, dk, dv, scale, sink, s, out);
}

}  // namespace kernels::ref
