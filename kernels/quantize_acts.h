// Activations quantized for the dots (Q8_0, Q8_K, Q8_1), as ggml's reference quantizes them: the
// reference (ref.cpp). The AVX2 and AVX-512 files write the Q8_0 and Q8_K ones with intrinsics to
// the same bytes (test Kernels.ActivationQuantizersGiveTheReferencesBytes).
#pragma once

#include <cmath>
#include <cstring>

#include "kernels/fp16.h"
#include "kernels/quant_blocks.h"

namespace kernels {
namespace {

inline int nearest_int(float fval) {  // ggml's round-half-even trick, valid for |fval| < 2^22
  float val = fval + 12582912.f;
  int i;
  std::memcpy(&i, &val, 4);
  return (i & 0x007fffff) - 0x00400000;
}

inline void quantize_q8_0_body(const float* x, BlockQ8_0* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK8_0; ++b) {
    float amax = 0;
    for (int i = 0; i < kQK8_0; ++i) amax = std::fmax(amax, std::fabs(x[b * kQK8_0 + i]));
    const float d = amax / 127.f;
    const float id = amax != 0.0f ? 127.f / amax : 0.0f;
    y[b].d = fp32_to_fp16(d);
    for (int i = 0; i < kQK8_0; ++i)
      y[b].qs[i] = static_cast<int8_t>(std::nearbyint(x[b * kQK8_0 + i] * id));
  }
}

// Q8_1 (the Q4_1 / Q5_1 dots): Q8_0's quants plus s = d * sum(qs), d unrounded (llama.cpp's x86
// quantize_row_q8_1).
inline void quantize_q8_1_body(const float* x, BlockQ8_1* y, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b) {
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::fmax(amax, std::fabs(x[b * 32 + i]));
    const float d = amax / 127.f;
    const float id = amax != 0.0f ? 127.f / amax : 0.0f;
    y[b].d = fp32_to_fp16(d);
    int sum = 0;
    for (int i = 0; i < 32; ++i) {
      y[b].qs[i] = static_cast<int8_t>(std::nearbyint(x[b * 32 + i] * id));
      sum += y[b].qs[i];
    }
    y[b].s = fp32_to_fp16(d * static_cast<float>(sum));
  }
}

inline void quantize_q8_k_body(const float* x, BlockQ8K* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b, x += kQK_K) {
    float max = 0, amax = 0;
    for (int j = 0; j < kQK_K; ++j) {
      float ax = std::fabs(x[j]);
      if (ax > amax) amax = ax, max = x[j];
    }
    if (amax == 0) {
      y[b].d = 0;
      std::memset(y[b].qs, 0, sizeof y[b].qs);
      std::memset(y[b].bsums, 0, sizeof y[b].bsums);
      continue;
    }
    const float iscale = -127.f / max;
    for (int j = 0; j < kQK_K; ++j) {
      int v = nearest_int(iscale * x[j]);
      y[b].qs[j] = static_cast<int8_t>(v < 127 ? v : 127);
    }
    for (int j = 0; j < kQK_K / 16; ++j) {
      int sum = 0;
      for (int i = 0; i < 16; ++i) sum += y[b].qs[j * 16 + i];
      y[b].bsums[j] = static_cast<int16_t>(sum);
    }
    y[b].d = 1 / iscale;
  }
}

}  // namespace
}  // namespace kernels
