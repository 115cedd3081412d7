// Dequantization of every weight type, 32 elements at a time, compiled for the host (the scalar
// reference's dequantize_row) and for the device (the CUDA matmul): one decoder per type, so the
// GPU's weights are bit for bit the CPU reference's. The float expressions are ggml's
// (dequantize_row_* in ggml-quants.c), so embeddings read from a quantized table match
// llama.cpp's. Every block size is a multiple of 32; chunk c holds elements 32c .. 32c + 31.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#ifdef __CUDACC__
#include <cuda_fp16.h>
#endif

#include "kernels/fp16.h"
#include "kernels/quant_blocks.h"
#include "kernels/types.h"

namespace kernels {

namespace iq {
#define KERNELS_TABLE(type, name, n) inline constexpr type name[n]
#include "kernels/iq_tables.inc"
#undef KERNELS_TABLE
}  // namespace iq
#ifdef __CUDACC__
namespace iq_dev {
#define KERNELS_TABLE(type, name, n) static __device__ const type name[n]
#include "kernels/iq_tables.inc"
#undef KERNELS_TABLE
}  // namespace iq_dev
#endif
#ifdef __CUDA_ARCH__
#define KERNELS_IQ(name) ::kernels::iq_dev::name
#else
#define KERNELS_IQ(name) ::kernels::iq::name
#endif

// Every weight type the kernels run, for code that instantiates one body per type.
// clang-format off
#define KERNELS_WEIGHT_TYPES(X)                                                    \
  X(F32) X(F16) X(BF16) X(Q4_0) X(Q4_1) X(Q5_0) X(Q5_1) X(Q8_0) X(MXFP4) X(NVFP4) \
  X(Q1_0) X(Q2_0) X(IQ4_NL) X(Q2_K) X(Q3_K) X(Q4_K) X(Q5_K) X(Q6_K) X(TQ1_0)      \
  X(TQ2_0) X(IQ2_XXS) X(IQ2_XS) X(IQ2_S) X(IQ3_XXS) X(IQ3_S) X(IQ1_S) X(IQ1_M)     \
  X(IQ4_XS)
// clang-format on

namespace dq {

KERNELS_HD inline float h2f(uint16_t h) {
#ifdef __CUDA_ARCH__
  return __half2float(__ushort_as_half(h));
#else
  return fp16_to_fp32(h);
#endif
}
KERNELS_HD inline float bf2f(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}
KERNELS_HD inline uint32_t le32(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}
KERNELS_HD inline uint16_t le16(const uint8_t* p) {
  return uint16_t(p[0] | p[1] << 8);
}
KERNELS_HD inline int grid_byte(uint64_t g, int j) {
  return int((g >> (8 * j)) & 0xFF);
}
KERNELS_HD inline int grid_sbyte(uint64_t g, int j) {  // IQ1 grids hold int8 values
  return int(int8_t((g >> (8 * j)) & 0xFF));
}
KERNELS_HD inline float sign(uint8_t signs, int j) {
  return signs & (1u << j) ? -1.f : 1.f;
}
// E2M1 values, doubled (MXFP4, NVFP4): a function, as device code cannot index a host array.
KERNELS_HD inline int fp4(int nibble) {
  const int8_t v[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
  return v[nibble];
}

// Eight values of one IQ2 group: db * grid magnitude * sign.
KERNELS_HD inline void iq2_group(float db, uint64_t grid, uint8_t signs, float* w) {
  for (int j = 0; j < 8; ++j) w[j] = db * grid_byte(grid, j) * sign(signs, j);
}

}  // namespace dq

// Element i of a row of a float type (block_elems 1: rows of any length, not only whole chunks of
// 32); 0 for the block-quantized types, whose rows are whole blocks.
template <uint32_t T>
KERNELS_HD inline float float_elem(const uint8_t* row, int64_t i) {
  if constexpr (T == F32) return reinterpret_cast<const float*>(row)[i];
  if constexpr (T == F16) return dq::h2f(reinterpret_cast<const uint16_t*>(row)[i]);
  if constexpr (T == BF16) return dq::bf2f(reinterpret_cast<const uint16_t*>(row)[i]);
  return 0.0f;
}

template <uint32_t T>
KERNELS_HD inline void dequant32(const uint8_t* row, int64_t c, float* w) {
  using namespace dq;
  if constexpr (T == F32) {
    const float* r = reinterpret_cast<const float*>(row) + c * 32;
    for (int i = 0; i < 32; ++i) w[i] = r[i];
  } else if constexpr (T == F16 || T == BF16) {
    const uint16_t* r = reinterpret_cast<const uint16_t*>(row) + c * 32;
    for (int i = 0; i < 32; ++i) w[i] = T == F16 ? h2f(r[i]) : bf2f(r[i]);
  } else if constexpr (T == Q8_0) {
    const BlockQ8_0& b = reinterpret_cast<const BlockQ8_0*>(row)[c];
    const float d = h2f(b.d);
    for (int i = 0; i < 32; ++i) w[i] = b.qs[i] * d;
  } else if constexpr (T == Q8_1) {
    const BlockQ8_1& b = reinterpret_cast<const BlockQ8_1*>(row)[c];
    const float d = h2f(b.d);
    for (int i = 0; i < 32; ++i) w[i] = b.qs[i] * d;
  } else if constexpr (T == Q4_0 || T == Q4_1 || T == IQ4_NL) {
    const uint8_t* blk = row + c * (T == Q4_1 ? sizeof(BlockQ4_1) : sizeof(BlockQ4_0));
    const float d = h2f(le16(blk)), m = T == Q4_1 ? h2f(le16(blk + 2)) : 0.f;
    const uint8_t* qs = blk + (T == Q4_1 ? 4 : 2);
    for (int j = 0; j < 16; ++j) {
      const int lo = qs[j] & 0xF, hi = qs[j] >> 4;
      if constexpr (T == Q4_0) {
        w[j] = (lo - 8) * d, w[j + 16] = (hi - 8) * d;
      } else if constexpr (T == Q4_1) {
        w[j] = lo * d + m, w[j + 16] = hi * d + m;
      } else {
        w[j] = d * KERNELS_IQ(kvalues_iq4nl)[lo], w[j + 16] = d * KERNELS_IQ(kvalues_iq4nl)[hi];
      }
    }
  } else if constexpr (T == Q5_0 || T == Q5_1) {
    const uint8_t* blk = row + c * (T == Q5_1 ? sizeof(BlockQ5_1) : sizeof(BlockQ5_0));
    const float d = h2f(le16(blk));
    const uint8_t* qhp = blk + (T == Q5_1 ? 4 : 2);
    const uint32_t qh = le32(qhp);
    const uint8_t* qs = qhp + 4;
    for (int j = 0; j < 16; ++j) {
      const int lo = (qs[j] & 0xF) | ((qh >> j) & 1) << 4;
      const int hi = (qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4;
      if constexpr (T == Q5_0) {
        w[j] = d * (lo - 16), w[j + 16] = d * (hi - 16);
      } else {
        const float m = h2f(le16(blk + 2));
        w[j] = lo * d + m, w[j + 16] = hi * d + m;
      }
    }
  } else if constexpr (T == MXFP4) {
    const BlockMxfp4& b = reinterpret_cast<const BlockMxfp4*>(row)[c];
    const float d = e8m0_half(b.e);
    for (int i = 0; i < 16; ++i) {
      w[i] = d * fp4(b.qs[i] & 0xF);
      w[i + 16] = d * fp4(b.qs[i] >> 4);
    }
  } else if constexpr (T == NVFP4) {
    const BlockNvfp4& b = reinterpret_cast<const BlockNvfp4*>(row)[c / 2];
    for (int s = 2 * (c % 2), o = 0; o < 32; ++s, o += 16) {
      const float d = ue4m3_half(b.d[s]);
      for (int j = 0; j < 8; ++j) {
        w[o + j] = fp4(b.qs[8 * s + j] & 0xF) * d;
        w[o + j + 8] = fp4(b.qs[8 * s + j] >> 4) * d;
      }
    }
  } else if constexpr (T == Q1_0) {
    const BlockQ1_0& b = reinterpret_cast<const BlockQ1_0*>(row)[c / 4];
    const float d = h2f(b.d), neg = -d;
    const uint8_t* bits = b.qs + 4 * (c % 4);
    for (int i = 0; i < 32; ++i) w[i] = (bits[i / 8] >> (i % 8)) & 1 ? d : neg;
  } else if constexpr (T == Q2_0) {
    const BlockQ2_0& b = reinterpret_cast<const BlockQ2_0*>(row)[c / 2];
    const float d = h2f(b.d);
    const uint8_t* qs = b.qs + 8 * (c % 2);
    for (int i = 0; i < 32; ++i) w[i] = (int((qs[i / 4] >> (2 * (i % 4))) & 3) - 1) * d;
  } else if constexpr (T == Q2_K || T == Q3_K) {
    // Chunk k of 8: 2-bit field k % 4 of bytes 32 (k / 4) .. + 31, sub-blocks 2k and 2k + 1.
    const int k = int(c % 8), shift = 2 * (k % 4);
    if constexpr (T == Q2_K) {
      const BlockQ2K& b = reinterpret_cast<const BlockQ2K*>(row)[c / 8];
      const float d = h2f(b.d), mn = h2f(b.dmin);
      const uint8_t* q = b.qs + 32 * (k / 4);
      for (int h = 0; h < 2; ++h) {
        const uint8_t sc = b.scales[2 * k + h];
        const float dl = d * (sc & 0xF), ml = mn * (sc >> 4);
        for (int l = 0; l < 16; ++l) w[16 * h + l] = dl * ((q[16 * h + l] >> shift) & 3) - ml;
      }
    } else {
      const BlockQ3K& b = reinterpret_cast<const BlockQ3K*>(row)[c / 8];
      int8_t scales[16];
      q3k_scales(b.scales, scales);
      const float d = h2f(b.d);
      const uint8_t* q = b.qs + 32 * (k / 4);
      for (int h = 0; h < 2; ++h) {
        const float dl = d * (scales[2 * k + h] - 32);
        for (int l = 0; l < 16; ++l) {
          const int i = 16 * h + l;
          w[i] = dl * (int((q[i] >> shift) & 3) - ((b.hmask[i] >> k) & 1 ? 0 : 4));
        }
      }
    }
  } else if constexpr (T == Q4_K || T == Q5_K) {
    const int j = static_cast<int>(c % 8);
    const uint8_t *scales, *qs, *qh = nullptr;
    uint16_t hd, hm;
    if constexpr (T == Q4_K) {
      const BlockQ4K& b = reinterpret_cast<const BlockQ4K*>(row)[c / 8];
      scales = b.scales, qs = b.qs, hd = b.d, hm = b.dmin;
    } else {
      const BlockQ5K& b = reinterpret_cast<const BlockQ5K*>(row)[c / 8];
      scales = b.scales, qs = b.qs, qh = b.qh, hd = b.d, hm = b.dmin;
    }
    uint8_t sc, m;
    k4_scale_min(j, scales, &sc, &m);
    const float d = h2f(hd) * sc, mn = h2f(hm) * m;
    const uint8_t* q = qs + (j / 2) * 32;
    const int shift = (j & 1) * 4;
    for (int i = 0; i < 32; ++i) {
      int v = (q[i] >> shift) & 0xF;
      if constexpr (T == Q5_K) v |= ((qh[i] >> j) & 1) << 4;
      w[i] = d * v - mn;
    }
  } else if constexpr (T == Q6_K) {
    const BlockQ6K& b = reinterpret_cast<const BlockQ6K*>(row)[c / 8];
    const int j = static_cast<int>(c % 8), h = j / 4, g = j % 4;
    const uint8_t* ql = b.ql + 64 * h + (g & 1) * 32;
    const uint8_t* qh = b.qh + 32 * h;
    const int8_t* sc = b.scales + 8 * h + 2 * g;
    const float d = h2f(b.d);
    for (int i = 0; i < 32; ++i) {
      const int q = ((ql[i] >> (4 * (g >> 1))) & 0xF) | (((qh[i] >> (2 * g)) & 3) << 4);
      w[i] = d * sc[i / 16] * (q - 32);
    }
  } else if constexpr (T == TQ1_0) {
    const BlockTq1_0& b = reinterpret_cast<const BlockTq1_0*>(row)[c / 8];
    const float d = h2f(b.d);
    const uint8_t pow3[5] = {1, 3, 9, 27, 81};
    for (int i = 0; i < 32; ++i) {
      const int e = int(c % 8) * 32 + i;  // element in the block: 160 from qs[0..32), 80 from
      uint8_t byte, p;                    // qs[32..48), 16 from qh, five (four) digits per byte
      if (e < 160) {
        byte = b.qs[e % 32], p = pow3[e / 32];
      } else if (e < 240) {
        byte = b.qs[32 + (e - 160) % 16], p = pow3[(e - 160) / 16];
      } else {
        byte = b.qh[(e - 240) % 4], p = pow3[(e - 240) / 4];
      }
      const uint8_t q = uint8_t(byte * p);
      w[i] = float(int((uint16_t(q) * 3) >> 8) - 1) * d;
    }
  } else if constexpr (T == TQ2_0) {
    const BlockTq2_0& b = reinterpret_cast<const BlockTq2_0*>(row)[c / 8];
    const int k = int(c % 8);
    const float d = h2f(b.d);
    const uint8_t* q = b.qs + 32 * (k / 4);
    for (int i = 0; i < 32; ++i) w[i] = float(int((q[i] >> (2 * (k % 4))) & 3) - 1) * d;
  } else if constexpr (T == IQ2_XXS) {
    const BlockIq2Xxs& b = reinterpret_cast<const BlockIq2Xxs*>(row)[c / 8];
    const uint8_t* q = reinterpret_cast<const uint8_t*>(b.qs) + 8 * (c % 8);
    const uint32_t aux = le32(q + 4);
    const float db = h2f(b.d) * (0.5f + (aux >> 28)) * 0.25f;
    for (int l = 0; l < 4; ++l)
      iq2_group(db, KERNELS_IQ(iq2xxs_grid)[q[l]], KERNELS_IQ(ksigns_iq2xs)[(aux >> (7 * l)) & 127],
                w + 8 * l);
  } else if constexpr (T == IQ2_XS) {
    const BlockIq2Xs& b = reinterpret_cast<const BlockIq2Xs*>(row)[c / 8];
    const int ib = int(c % 8);
    const float d = h2f(b.d);
    const float db[2] = {d * (0.5f + (b.scales[ib] & 0xf)) * 0.25f,
                         d * (0.5f + (b.scales[ib] >> 4)) * 0.25f};
    for (int l = 0; l < 4; ++l) {
      const uint16_t q = b.qs[4 * ib + l];
      iq2_group(db[l / 2], KERNELS_IQ(iq2xs_grid)[q & 511], KERNELS_IQ(ksigns_iq2xs)[q >> 9],
                w + 8 * l);
    }
  } else if constexpr (T == IQ2_S) {
    const BlockIq2S& b = reinterpret_cast<const BlockIq2S*>(row)[c / 8];
    const int ib = int(c % 8);
    const float d = h2f(b.d);
    const float db[2] = {d * (0.5f + (b.scales[ib] & 0xf)) * 0.25f,
                         d * (0.5f + (b.scales[ib] >> 4)) * 0.25f};
    const uint8_t* qs = b.qs + 4 * ib;
    const uint8_t* signs = b.qs + 32 + 4 * ib;
    for (int l = 0; l < 4; ++l)
      iq2_group(db[l / 2], KERNELS_IQ(iq2s_grid)[qs[l] | ((b.qh[ib] << (8 - 2 * l)) & 0x300)],
                signs[l], w + 8 * l);
  } else if constexpr (T == IQ3_XXS) {
    const BlockIq3Xxs& b = reinterpret_cast<const BlockIq3Xxs*>(row)[c / 8];
    const int ib = int(c % 8);
    const uint8_t* qs = b.qs + 8 * ib;
    const uint32_t aux = le32(b.qs + 64 + 4 * ib);
    const float db = h2f(b.d) * (0.5f + (aux >> 28)) * 0.5f;
    for (int l = 0; l < 4; ++l) {
      const uint8_t signs = KERNELS_IQ(ksigns_iq2xs)[(aux >> (7 * l)) & 127];
      const uint32_t g1 = KERNELS_IQ(iq3xxs_grid)[qs[2 * l]],
                     g2 = KERNELS_IQ(iq3xxs_grid)[qs[2 * l + 1]];
      for (int j = 0; j < 4; ++j) {
        w[8 * l + j] = db * grid_byte(g1, j) * sign(signs, j);
        w[8 * l + j + 4] = db * grid_byte(g2, j) * sign(signs, j + 4);
      }
    }
  } else if constexpr (T == IQ3_S) {
    const BlockIq3S& b = reinterpret_cast<const BlockIq3S*>(row)[c / 8];
    const int ib = int(c % 8);
    const int ls = ib % 2 ? b.scales[ib / 2] >> 4 : b.scales[ib / 2] & 0xf;
    const float db = h2f(b.d) * (1 + 2 * ls);
    const uint8_t* qs = b.qs + 8 * ib;
    const uint8_t* signs = b.signs + 4 * ib;
    const int qh = b.qh[ib];
    for (int l = 0; l < 4; ++l) {
      const uint32_t g1 = KERNELS_IQ(iq3s_grid)[qs[2 * l] | ((qh << (8 - 2 * l)) & 256)];
      const uint32_t g2 = KERNELS_IQ(iq3s_grid)[qs[2 * l + 1] | ((qh << (7 - 2 * l)) & 256)];
      for (int j = 0; j < 4; ++j) {
        w[8 * l + j] = db * grid_byte(g1, j) * sign(signs[l], j);
        w[8 * l + j + 4] = db * grid_byte(g2, j) * sign(signs[l], j + 4);
      }
    }
  } else if constexpr (T == IQ1_S) {
    const BlockIq1S& b = reinterpret_cast<const BlockIq1S*>(row)[c / 8];
    const int ib = int(c % 8);
    const uint16_t qh = b.qh[ib];
    const float dl = h2f(b.d) * (2 * ((qh >> 12) & 7) + 1);
    const float delta = qh & 0x8000 ? -kIq1Delta : kIq1Delta;
    for (int l = 0; l < 4; ++l) {
      const uint64_t g = KERNELS_IQ(iq1s_grid)[b.qs[4 * ib + l] | (((qh >> (3 * l)) & 7) << 8)];
      for (int j = 0; j < 8; ++j) w[8 * l + j] = dl * (grid_sbyte(g, j) + delta);
    }
  } else if constexpr (T == IQ1_M) {
    const BlockIq1M& b = reinterpret_cast<const BlockIq1M*>(row)[c / 8];
    const int ib = int(c % 8);
    const float d = h2f(iq1m_scale_bits(b.scales));
    const uint16_t sc = le16(b.scales + 2 * (ib / 2));
    const float dl[2] = {d * (2 * ((sc >> (6 * (ib % 2) + 0)) & 0x7) + 1),
                         d * (2 * ((sc >> (6 * (ib % 2) + 3)) & 0x7) + 1)};
    const uint8_t* qs = b.qs + 4 * ib;
    const uint8_t* qh = b.qh + 2 * ib;
    for (int l = 0; l < 4; ++l) {
      const int h = qh[l / 2] >> (4 * (l % 2));  // this group's 4 bits: 3 of index, 1 of delta
      const uint64_t g = KERNELS_IQ(iq1s_grid)[qs[l] | ((h & 7) << 8)];
      const float delta = h & 0x08 ? -kIq1Delta : kIq1Delta;
      for (int j = 0; j < 8; ++j) w[8 * l + j] = dl[l / 2] * (grid_sbyte(g, j) + delta);
    }
  } else if constexpr (T == IQ4_XS) {
    const BlockIq4Xs& b = reinterpret_cast<const BlockIq4Xs*>(row)[c / 8];
    const int ib = int(c % 8);
    const int ls =
        ((b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xf) | (((b.scales_h >> (2 * ib)) & 3) << 4);
    const float dl = h2f(b.d) * (ls - 32);
    const uint8_t* qs = b.qs + 16 * ib;
    for (int j = 0; j < 16; ++j) {
      w[j] = dl * KERNELS_IQ(kvalues_iq4nl)[qs[j] & 0xf];
      w[j + 16] = dl * KERNELS_IQ(kvalues_iq4nl)[qs[j] >> 4];
    }
  } else {
    static_assert(T == F32, "a weight type without a decoder");
  }
}

}  // namespace kernels
