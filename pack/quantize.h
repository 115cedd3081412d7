// Minimal quantizers for synthetic models: float rows -> F16, Q8_0 or Q4_K blocks in GGML's
// layouts, and random-but-valid blocks for bulk weights. Not llama.cpp's optimal search: the
// synthetic models only need valid, finite blocks with controlled scale.
#pragma once

#include <cstdint>
#include <span>

#include "gguf/ggml_types.h"

namespace expertd::pack {

uint16_t fp32_to_fp16(float f);

// Whether quantize_row takes `type` (F32, F16, Q8_0, Q4_K).
bool has_quantizer(gguf::GgmlType type);

// Quantizes one row of `src.size()` floats (a multiple of the type's block) into `dst`.
void quantize_row(gguf::GgmlType type, std::span<const float> src, uint8_t* dst);

// Fills `bytes` of `type` blocks with random values whose dequantized std is about `std_dev`
// (any weight type the kernels run: kernels/random_blocks.h for the types without a case here).
void random_blocks(gguf::GgmlType type, uint8_t* dst, uint64_t bytes, float std_dev, uint64_t& rng);

inline uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
// Approximately N(0,1): sum of four uniforms, rescaled.
inline float gauss(uint64_t& s) {
  uint64_t r = splitmix64(s);
  float sum = 0;
  for (int i = 0; i < 4; ++i) sum += static_cast<float>((r >> (16 * i)) & 0xFFFF) / 65535.0f;
  return (sum - 2.0f) * 1.7320508f;
}

}  // namespace expertd::pack
