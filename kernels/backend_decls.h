// Declarations of the per-backend kernel bodies (kernels/impl.inc).
#pragma once

#include <cstdint>

#include "kernels/quant_blocks.h"

#define KERNELS_DECLARE(NS)                                                      \
  namespace kernels::NS {                                                        \
  void quantize_q8_0(const float* x, BlockQ8_0* y, int64_t n);                   \
  void quantize_q8_k(const float* x, BlockQ8K* y, int64_t n);                    \
  float dot_f32(const float* a, const float* b, int64_t n);                      \
  void axpy(float a, const float* x, float* y, int64_t n);                       \
  void attend(const float* q, const float* k, const float* v, int64_t n_keys, int64_t k_stride,      \
              int64_t v_stride, int64_t dk, int64_t dv, float scale, float sink, float* s, float* out); \
  float dot_f16(const uint16_t* a, const uint16_t* b, int64_t n);                \
  float dot_bf16(const uint16_t* a, const uint16_t* b, int64_t n);               \
  float dot_q8_0(const BlockQ8_0* x, const BlockQ8_0* y, int64_t n);             \
  float dot_q5_0(const BlockQ5_0* x, const BlockQ8_0* y, int64_t n);            \
  float dot_mxfp4(const BlockMxfp4* x, const BlockQ8_0* y, int64_t n);          \
  float dot_q4_k(const BlockQ4K* x, const BlockQ8K* y, int64_t n);               \
  float dot_q5_k(const BlockQ5K* x, const BlockQ8K* y, int64_t n);               \
  float dot_q6_k(const BlockQ6K* x, const BlockQ8K* y, int64_t n);               \
  float dot(uint32_t wtype, const void* w, const void* x, int64_t n);            \
  /* one weight row against n_tok (1..kMaxTile) activation rows */              \
  void dot_tile(uint32_t wtype, const void* w, const void* const* xs, int n_tok, int64_t n, float* out); \
  }
KERNELS_DECLARE(scalar)
KERNELS_DECLARE(avx2)
KERNELS_DECLARE(avx512)
