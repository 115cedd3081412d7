// Sampling: greedy (temperature <= 0), or temperature with top-k and top-p, seeded.
#pragma once

#include <cstdint>
#include <random>
#include <span>

namespace engine {

struct SamplerParams {
  float temperature = 0.8f;
  int top_k = 40;       // 0 = off
  float top_p = 0.95f;  // 1 = off
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(SamplerParams p) : p_(p), rng_(p.seed) {}
  int32_t sample(std::span<const float> logits);

 private:
  SamplerParams p_;
  std::mt19937_64 rng_;
};

}  // namespace engine
