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

// --- The legacy 32-element blocks ---

struct BlockQ4_0 {  // value = d * (q - 8)
  uint16_t d;
  uint8_t qs[16];  // element j in the low nibble of qs[j], j + 16 in the high nibble
};
struct BlockQ4_1 {  // value = d * q + m
  uint16_t d, m;
  uint8_t qs[16];
};
struct BlockQ5_1 {  // value = d * q + m, q of 5 bits (fifth bits in qh)
  uint16_t d, m;
  uint8_t qh[4];
  uint8_t qs[16];
};
// Activations of the Q4_1 / Q5_1 dots: s = d * sum(qs), both fp16.
struct BlockQ8_1 {
  uint16_t d, s;
  int8_t qs[32];
};
struct BlockIq4Nl {  // value = d * kvalues_iq4nl[nibble]
  uint16_t d;
  uint8_t qs[16];
};

// --- Low-bit blocks of other sizes ---

struct BlockQ1_0 {  // 128 elements: value = bit ? d : -d (element j: bit j % 8 of qs[j / 8])
  uint16_t d;
  uint8_t qs[16];
};
struct BlockQ2_0 {  // 64 elements: value = d * (q - 1), q of 2 bits (element j: qs[j / 4])
  uint16_t d;
  uint8_t qs[16];
};
// NVFP4: 64 FP4 E2M1 values in four sub-blocks of 16, each with a UE4M3 scale; sub-block s:
// qs[8s + j] holds its value j (low nibble) and j + 8 (high nibble).
struct BlockNvfp4 {
  uint8_t d[4];
  uint8_t qs[32];
};

// --- Super-blocks of 256 ---

// 16 sub-blocks of 16: 4-bit scale (low) and min (high) per sub-block, 2-bit quants.
struct BlockQ2K {
  uint8_t scales[16];
  uint8_t qs[64];
  uint16_t d, dmin;
};
// 16 sub-blocks of 16 with 6-bit scales packed in 12 bytes; 2 low bits in qs, the high bit in
// hmask (value = d * (scale - 32) * (q - (high bit ? 0 : 4))).
struct BlockQ3K {
  uint8_t hmask[32];
  uint8_t qs[64];
  uint8_t scales[12];
  uint16_t d;
};
struct BlockTq1_0 {  // ternary: 5 values per byte in qs (base 3), 4 per byte in qh
  uint8_t qs[48];
  uint8_t qh[4];
  uint16_t d;
};
struct BlockTq2_0 {  // ternary in 2 bits: value = d * (q - 1)
  uint8_t qs[64];
  uint16_t d;
};
// IQ types: groups of 8 (or 4) values from a grid of magnitudes, signs from a 7-bit index into
// ksigns_iq2xs (the eighth sign is the parity), a 4-bit (or 3-bit) scale per sub-block.
struct BlockIq2Xxs {
  uint16_t d;
  uint16_t qs[32];
};
struct BlockIq2Xs {
  uint16_t d;
  uint16_t qs[32];
  uint8_t scales[8];
};
struct BlockIq2S {
  uint16_t d;
  uint8_t qs[64];  // 32 grid indices (low 8 bits), then 32 sign bytes
  uint8_t qh[8];
  uint8_t scales[8];
};
struct BlockIq3Xxs {
  uint16_t d;
  uint8_t qs[96];  // 64 grid indices, then 8 x 32 bits of signs and scale
};
struct BlockIq3S {
  uint16_t d;
  uint8_t qs[64];
  uint8_t qh[8];
  uint8_t signs[32];
  uint8_t scales[4];
};
struct BlockIq1S {
  uint16_t d;
  uint8_t qs[32];
  uint16_t qh[8];
};
struct BlockIq1M {  // no d field: its fp16 scale is spread over the top nibbles of `scales`
  uint8_t qs[32];
  uint8_t qh[16];
  uint8_t scales[8];
};
struct BlockIq4Xs {
  uint16_t d;
  uint16_t scales_h;
  uint8_t scales_l[4];
  uint8_t qs[128];
};

inline constexpr float kIq1Delta = 0.125f;  // IQ1S_DELTA, IQ1M_DELTA

static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_1) == 24 &&
              sizeof(BlockQ8_1) == 36 && sizeof(BlockIq4Nl) == 18 && sizeof(BlockQ1_0) == 18 &&
              sizeof(BlockQ2_0) == 18 && sizeof(BlockNvfp4) == 36 && sizeof(BlockQ2K) == 84 &&
              sizeof(BlockQ3K) == 110 && sizeof(BlockTq1_0) == 54 && sizeof(BlockTq2_0) == 66 &&
              sizeof(BlockIq2Xxs) == 66 && sizeof(BlockIq2Xs) == 74 && sizeof(BlockIq2S) == 82 &&
              sizeof(BlockIq3Xxs) == 98 && sizeof(BlockIq3S) == 110 && sizeof(BlockIq1S) == 50 &&
              sizeof(BlockIq1M) == 56 && sizeof(BlockIq4Xs) == 136);

// Q3_K: the 16 6-bit scales (still offset by 32) from the 12 packed bytes.
KERNELS_HD inline void q3k_scales(const uint8_t* packed, int8_t* out) {
  uint32_t a[4];
  for (int i = 0; i < 3; ++i)
    a[i] = uint32_t(packed[4 * i]) | uint32_t(packed[4 * i + 1]) << 8 |
           uint32_t(packed[4 * i + 2]) << 16 | uint32_t(packed[4 * i + 3]) << 24;
  const uint32_t m1 = 0x03030303, m2 = 0x0f0f0f0f, tmp = a[2];
  a[2] = ((a[0] >> 4) & m2) | (((tmp >> 4) & m1) << 4);
  a[3] = ((a[1] >> 4) & m2) | (((tmp >> 6) & m1) << 4);
  a[0] = (a[0] & m2) | (((tmp >> 0) & m1) << 4);
  a[1] = (a[1] & m2) | (((tmp >> 2) & m1) << 4);
  for (int i = 0; i < 16; ++i) out[i] = static_cast<int8_t>((a[i / 4] >> (8 * (i % 4))) & 0xFF);
}

// IQ1_M: the fp16 bits of its block scale, from the top nibbles of the four 16-bit scale words.
KERNELS_HD inline uint16_t iq1m_scale_bits(const uint8_t* scales) {
  uint16_t sc[4];
  for (int i = 0; i < 4; ++i) sc[i] = uint16_t(scales[2 * i] | scales[2 * i + 1] << 8);
  return uint16_t((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) |
                  (sc[3] & 0xf000));
}

// MXFP4's E8M0 scale, halved as ggml keeps it: 2^(e - 128), exact (subnormal for e < 2), without
// a libm call.
KERNELS_HD inline float e8m0_half(uint8_t e) {
  const uint32_t bits = e >= 2 ? uint32_t(e - 1) << 23 : 0x00200000u << e;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// UE4M3 (NVFP4's sub-block scale), halved as ggml keeps it (its FP4 values are doubled).
KERNELS_HD inline float ue4m3_half(uint8_t x) {
  if (x == 0 || x == 0x7F) return 0.0f;
  const int e = (x >> 3) & 0xF, m = x & 7;
  // 2^(e-7) * (1 + m/8), or m * 2^-9 when subnormal; exact in float.
  const float raw = e == 0 ? float(m) * (1.0f / 512.0f)
                           : (1.0f + float(m) / 8.0f) * float(1u << e) * (1.0f / 128.0f);
  return raw * 0.5f;
}

}  // namespace kernels
