// Random but valid blocks of every weight type, for the kernel tests and for synthetic models
// (expert-pack synth): random quants, grid indices and signs (every bit pattern of those is
// valid), and block scales set so that the dequantized values have about the standard deviation
// asked for. Scales are where a random bit pattern would be invalid (NaN or huge fp16, E8M0).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/fp16.h"
#include "kernels/kernels.h"
#include "kernels/quant_blocks.h"

namespace kernels {

namespace detail {
struct ScaleFields {
  int d = -1, m = -1;  // byte offsets of fp16 scale and min in the block (-1: none)
  float m_ratio = 0;   // min = m_ratio * d: centres the values of the types with a min
};
inline ScaleFields scale_fields(uint32_t t) {
  switch (t) {
    case Q4_0:
    case Q5_0:
    case Q8_0:
    case IQ4_NL:
    case Q1_0:
    case Q2_0:
    case IQ2_XXS:
    case IQ2_XS:
    case IQ2_S:
    case IQ3_XXS:
    case IQ3_S:
    case IQ1_S:
    case IQ4_XS:
      return {0};
    case Q4_1:
      return {0, 2, -7.5f};
    case Q5_1:
      return {0, 2, -15.5f};
    case Q4_K:
    case Q5_K:
      return {0, 2, 6.0f};
    case Q2_K:
      return {80, 82, 1.5f};
    case Q3_K:
      return {108};
    case Q6_K:
      return {208};
    case TQ1_0:
      return {52};
    case TQ2_0:
      return {64};
    default:
      return {};
  }
}
inline void put16(uint8_t* p, uint16_t v) {
  std::memcpy(p, &v, 2);
}
inline uint64_t next(uint64_t& s) {  // splitmix64
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
inline float gauss(uint64_t& s) {  // about N(0, 1)
  const uint64_t r = next(s);
  float sum = 0;
  for (int i = 0; i < 4; ++i) sum += static_cast<float>((r >> (16 * i)) & 0xFFFF) / 65535.0f;
  return (sum - 2.0f) * 1.7320508f;
}
// Sets every block's scales for a scale value `d` (the type's own unit).
inline void set_scales(uint32_t t, uint8_t* p, size_t n_blocks, float d, uint64_t& rng) {
  const TypeTraits* tr = type_traits(t);
  const ScaleFields f = scale_fields(t);
  for (size_t b = 0; b < n_blocks; ++b, p += tr->block_bytes) {
    if (f.d >= 0) put16(p + f.d, fp32_to_fp16(d));
    if (f.m >= 0) put16(p + f.m, fp32_to_fp16(f.m_ratio * d));
    if (t == MXFP4) {
      p[0] = static_cast<uint8_t>(std::lround(std::log2(d)) + 128 + int(next(rng) % 2));
    } else if (t == NVFP4) {
      for (int s = 0; s < 4; ++s) {  // UE4M3 near 2 d (it is halved): exponent and mantissa
        const int e = std::max(1, std::min(14, int(std::lround(std::log2(2 * d))) + 7));
        p[s] = static_cast<uint8_t>(e << 3 | (next(rng) & 7));
      }
    } else if (t == IQ1_M) {  // the fp16 scale lives in the top nibbles of four 16-bit words
      const uint16_t h = fp32_to_fp16(d);
      for (int w = 0; w < 4; ++w) {
        uint16_t v;
        std::memcpy(&v, p + 48 + 2 * w, 2);
        v = uint16_t((v & 0x0FFF) | ((h >> (4 * w)) & 0xF) << 12);
        put16(p + 48 + 2 * w, v);
      }
    }
  }
}
}  // namespace detail

// Fills `bytes` (whole blocks) of `type` with valid blocks whose values have about `std_dev`.
inline void random_blocks(uint32_t type, uint8_t* dst, size_t bytes, float std_dev, uint64_t& rng) {
  const TypeTraits* tr = type_traits(type);
  if (type == F32 || type == F16 || type == BF16) {
    const size_t n = bytes / tr->block_bytes;
    for (size_t i = 0; i < n; ++i) {
      const float v = detail::gauss(rng) * std_dev;
      if (type == F32) {
        std::memcpy(dst + 4 * i, &v, 4);
      } else {
        detail::put16(dst + 2 * i, type == F16 ? fp32_to_fp16(v) : fp32_to_bf16(v));
      }
    }
    return;
  }
  for (size_t i = 0; i + 8 <= bytes; i += 8) {
    const uint64_t r = detail::next(rng);
    std::memcpy(dst + i, &r, 8);
  }
  for (size_t i = bytes / 8 * 8; i < bytes; ++i) dst[i] = static_cast<uint8_t>(detail::next(rng));
  const size_t n_blocks = bytes / tr->block_bytes;
  // Calibrate on the first blocks: the values are linear in the scale.
  const size_t probe = std::min<size_t>(n_blocks, 16);
  uint64_t r2 = rng;
  detail::set_scales(type, dst, probe, 1.0f, r2);
  std::vector<float> y(probe * tr->block_elems);
  dequantize_row(type, dst, y.data(), static_cast<int64_t>(y.size()));
  double s2 = 0;
  for (float v : y) s2 += double(v) * v;
  const double unit = std::sqrt(s2 / double(y.size() ? y.size() : 1));
  const float d = unit > 0 ? static_cast<float>(std_dev / unit) : std_dev;
  detail::set_scales(type, dst, n_blocks, d, rng);
}

}  // namespace kernels
