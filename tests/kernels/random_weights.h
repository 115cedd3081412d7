// Random but valid weights of every supported type, shared by the CPU and GPU kernel tests.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/fp16.h"
#include "kernels/kernels.h"
#include "kernels/quant_blocks.h"

namespace kernels {

// Random but valid blocks: random quants, scales set to finite values of sane size.
inline std::vector<uint8_t> random_weights(uint32_t type, int64_t n, std::mt19937_64& rng) {
  std::vector<uint8_t> w(row_size(type, n));
  for (auto& b : w) b = static_cast<uint8_t>(rng());
  std::normal_distribution<float> g(0.f, 1.f);
  auto h = [&](float v) { return fp32_to_fp16(v); };
  switch (type) {
    case F32:
      for (int64_t i = 0; i < n; ++i) {
        float v = g(rng);
        std::memcpy(&w[4 * i], &v, 4);
      }
      break;
    case F16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t v = h(g(rng));
        std::memcpy(&w[2 * i], &v, 2);
      }
      break;
    case BF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t v = fp32_to_bf16(g(rng));
        std::memcpy(&w[2 * i], &v, 2);
      }
      break;
    case MXFP4:
      for (auto* b = reinterpret_cast<BlockMxfp4*>(w.data());
           b < reinterpret_cast<BlockMxfp4*>(w.data() + w.size()); ++b)
        b->e = static_cast<uint8_t>(120 + rng() % 8);
      break;
    case Q5_0:
      for (auto* b = reinterpret_cast<BlockQ5_0*>(w.data());
           b < reinterpret_cast<BlockQ5_0*>(w.data() + w.size()); ++b)
        b->d = h(0.02f);
      break;
    case Q8_0:
      for (auto* b = reinterpret_cast<BlockQ8_0*>(w.data());
           b < reinterpret_cast<BlockQ8_0*>(w.data() + w.size()); ++b)
        b->d = h(0.01f);
      break;
    case Q4_K:
      for (auto* b = reinterpret_cast<BlockQ4K*>(w.data());
           b < reinterpret_cast<BlockQ4K*>(w.data() + w.size()); ++b)
        b->d = h(0.005f), b->dmin = h(0.03f);
      break;
    case Q5_K:
      for (auto* b = reinterpret_cast<BlockQ5K*>(w.data());
           b < reinterpret_cast<BlockQ5K*>(w.data() + w.size()); ++b)
        b->d = h(0.003f), b->dmin = h(0.04f);
      break;
    case Q6_K:
      for (auto* b = reinterpret_cast<BlockQ6K*>(w.data());
           b < reinterpret_cast<BlockQ6K*>(w.data() + w.size()); ++b)
        b->d = h(0.001f);
      break;
  }
  return w;
}

}  // namespace kernels
