// GGML quantization block layouts, declared once for every backend (host and device).
// Sizes are static_asserted to ggml's (ggml-common.h); bytes in a GGUF map onto these directly.
#pragma once

#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define KERNELS_HD __host__ __device__
#else
#define KERNELS_HD
#endif

namespace kernels {

inline constexpr int kQK8_0 = 32;
inline constexpr int kQK_K = 256;
inline constexpr int kKScaleBytes = 12;

struct BlockQ8_0 {
  uint16_t d;  // fp16 scale
  int8_t qs[kQK8_0];
};
static_assert(sizeof(BlockQ8_0) == 34);

// 32 weights: fp16 scale, the fifth bit of each in qh, the low four bits in qs (value - 16).
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[kQK8_0 / 2];
};
static_assert(sizeof(BlockQ5_0) == 22);

// MXFP4 (gpt-oss experts): 32 FP4 E2M1 values sharing an E8M0 exponent. qs[j] holds value j in
// its low nibble and value j + 16 in its high nibble; value = kMxfp4Doubled[nibble] * 2^(e - 128)
// (ggml keeps the FP4 values doubled, as integers, and halves the scale).
struct BlockMxfp4 {
  uint8_t e;
  uint8_t qs[16];
};
static_assert(sizeof(BlockMxfp4) == 17);
inline constexpr int8_t kMxfp4Doubled[16] = {0, 1,  2,  3,  4,  6,  8,  12,
                                             0, -1, -2, -3, -4, -6, -8, -12};

// 8 sub-blocks of 32 with 6-bit scales and mins packed in 12 bytes; 4-bit quants.
struct BlockQ4K {
  uint16_t d, dmin;
  uint8_t scales[kKScaleBytes];
  uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockQ4K) == 144);

// As Q4_K plus one high bit per weight in qh.
struct BlockQ5K {
  uint16_t d, dmin;
  uint8_t scales[kKScaleBytes];
  uint8_t qh[kQK_K / 8];
  uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockQ5K) == 176);

// 16 sub-blocks of 16 with int8 scales; 6-bit quants: 4 low bits in ql, 2 high bits in qh.
struct BlockQ6K {
  uint8_t ql[kQK_K / 2];
  uint8_t qh[kQK_K / 4];
  int8_t scales[kQK_K / 16];
  uint16_t d;
};
static_assert(sizeof(BlockQ6K) == 210);

// Activations for K-quant dots: float scale, int8 quants, sums of each 16 quants.
struct BlockQ8K {
  float d;
  int8_t qs[kQK_K];
  int16_t bsums[kQK_K / 16];
};
static_assert(sizeof(BlockQ8K) == 292);

// Q4_K / Q5_K: the 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes.
KERNELS_HD inline void k4_scale_min(int j, const uint8_t* q, uint8_t* d, uint8_t* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// All eight at once (the SIMD dots): sm[0..8) scales, sm[8..16) mins.
inline void k_scales_mins(const uint8_t* scales, uint8_t* sm) {
  uint32_t u[4];
  std::memcpy(u, scales, 12);
  const uint32_t k1 = 0x3f3f3f3f, k2 = 0x0f0f0f0f, k3 = 0x03030303;
  u[3] = ((u[2] >> 4) & k2) | (((u[1] >> 6) & k3) << 4);
  const uint32_t m_lo = u[1] & k1;
  u[1] = (u[2] & k2) | (((u[0] >> 6) & k3) << 4);
  u[2] = m_lo;
  u[0] &= k1;
  std::memcpy(sm, u, 16);
}

}  // namespace kernels
