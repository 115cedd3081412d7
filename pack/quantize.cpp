#include "pack/quantize.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>

#include "kernels/fp16.h"
#include "kernels/random_blocks.h"

namespace expertd::pack {

uint16_t fp32_to_fp16(float f) {
  return kernels::fp32_to_fp16(f);
}

namespace {

void put16(uint8_t* p, uint16_t v) {
  std::memcpy(p, &v, 2);
}

void quantize_q8_0(std::span<const float> x, uint8_t* dst) {
  for (size_t b = 0; b < x.size() / 32; ++b, dst += 34) {
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b * 32 + i]));
    float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
    put16(dst, fp32_to_fp16(d));
    for (int i = 0; i < 32; ++i)
      dst[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(std::lrintf(x[b * 32 + i] * id)));
  }
}

// Q4_K: d, dmin (fp16), 12 bytes of 6-bit scales/mins for 8 sub-blocks of 32, 128 bytes of nibbles.
void quantize_q4_k(std::span<const float> x, uint8_t* dst) {
  for (size_t b = 0; b < x.size() / 256; ++b, dst += 144) {
    const float* v = x.data() + b * 256;
    float scale[8], minv[8], max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; ++j) {
      float lo = v[j * 32], hi = v[j * 32];
      for (int i = 1; i < 32; ++i)
        lo = std::min(lo, v[j * 32 + i]), hi = std::max(hi, v[j * 32 + i]);
      lo = std::min(lo, 0.0f);
      scale[j] = (hi - lo) / 15.0f;
      minv[j] = -lo;
      max_scale = std::max(max_scale, scale[j]);
      max_min = std::max(max_min, minv[j]);
    }
    float d = max_scale / 63.0f, dmin = max_min / 63.0f;
    uint8_t ls[8], lm[8];
    for (int j = 0; j < 8; ++j) {
      ls[j] = static_cast<uint8_t>(std::min(63L, d ? std::lrintf(scale[j] / d) : 0L));
      lm[j] = static_cast<uint8_t>(std::min(63L, dmin ? std::lrintf(minv[j] / dmin) : 0L));
    }
    put16(dst, fp32_to_fp16(d));
    put16(dst + 2, fp32_to_fp16(dmin));
    uint8_t* sc = dst + 4;
    for (int j = 0; j < 4; ++j) {
      sc[j] = static_cast<uint8_t>(ls[j] | ((ls[j + 4] >> 4) << 6));
      sc[j + 4] = static_cast<uint8_t>(lm[j] | ((lm[j + 4] >> 4) << 6));
      sc[j + 8] = static_cast<uint8_t>((ls[j + 4] & 0xF) | ((lm[j + 4] & 0xF) << 4));
    }
    uint8_t q[256];
    for (int j = 0; j < 8; ++j) {
      float sd = d * ls[j], md = dmin * lm[j];
      for (int i = 0; i < 32; ++i) {
        long l = sd ? std::lrintf((v[j * 32 + i] + md) / sd) : 0;
        q[j * 32 + i] = static_cast<uint8_t>(std::clamp(l, 0L, 15L));
      }
    }
    uint8_t* qs = dst + 16;
    for (int j = 0; j < 256; j += 64)
      for (int l = 0; l < 32; ++l)
        qs[j / 2 + l] = static_cast<uint8_t>(q[j + l] | (q[j + l + 32] << 4));
  }
}

}  // namespace

bool has_quantizer(gguf::GgmlType type) {
  using G = gguf::GgmlType;
  return type == G::F32 || type == G::F16 || type == G::Q8_0 || type == G::Q4_K;
}

void quantize_row(gguf::GgmlType type, std::span<const float> src, uint8_t* dst) {
  switch (type) {
    case gguf::GgmlType::F32:
      std::memcpy(dst, src.data(), src.size() * 4);
      break;
    case gguf::GgmlType::F16:
      for (size_t i = 0; i < src.size(); ++i) put16(dst + 2 * i, fp32_to_fp16(src[i]));
      break;
    case gguf::GgmlType::Q8_0:
      quantize_q8_0(src, dst);
      break;
    case gguf::GgmlType::Q4_K:
      quantize_q4_k(src, dst);
      break;
    default:
      assert(!"quantize_row: unsupported type");
  }
}

void random_blocks(gguf::GgmlType type, uint8_t* dst, uint64_t bytes, float std_dev,
                   uint64_t& rng) {
  for (uint64_t i = 0; i + 8 <= bytes; i += 8) {
    uint64_t r = splitmix64(rng);
    std::memcpy(dst + i, &r, 8);
  }
  for (uint64_t i = bytes & ~uint64_t{7}; i < bytes; ++i)
    dst[i] = static_cast<uint8_t>(splitmix64(rng));
  switch (type) {
    case gguf::GgmlType::F16: {
      for (uint64_t i = 0; i < bytes; i += 2) put16(dst + i, fp32_to_fp16(gauss(rng) * std_dev));
      break;
    }
    case gguf::GgmlType::F32: {
      for (uint64_t i = 0; i < bytes; i += 4) {
        float f = gauss(rng) * std_dev;
        std::memcpy(dst + i, &f, 4);
      }
      break;
    }
    case gguf::GgmlType::Q8_0: {
      uint16_t d = fp32_to_fp16(std_dev / 74.0f);  // int8 uniform has std ~74
      for (uint64_t i = 0; i < bytes; i += 34) put16(dst + i, d);
      break;
    }
    case gguf::GgmlType::Q4_K: {
      // value = d*sc*q - dmin*m with sc, m in [0,63], q in [0,15]: dmin = 7.5 d centres it.
      float d = std_dev / 200.0f;
      uint16_t hd = fp32_to_fp16(d), hm = fp32_to_fp16(7.5f * d);
      for (uint64_t i = 0; i < bytes; i += 144) put16(dst + i, hd), put16(dst + i + 2, hm);
      break;
    }
    default:
      kernels::random_blocks(static_cast<uint32_t>(type), dst, bytes, std_dev, rng);
  }
}

}  // namespace expertd::pack
