// Random but valid weights of every supported type, shared by the CPU and GPU kernel tests.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/random_blocks.h"

namespace kernels {

inline std::vector<uint8_t> random_weights(uint32_t type, int64_t n, std::mt19937_64& rng) {
  std::vector<uint8_t> w(row_size(type, n));
  uint64_t seed = rng();
  random_blocks(type, w.data(), w.size(), 0.05f, seed);
  return w;
}

}  // namespace kernels
