// Sampling: greedy (temperature <= 0), or temperature with top-k and top-p, seeded.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

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
  // Speculative decoding's draw where `draft` was guessed (engine/speculative.h): the draft itself
  // with probability p(draft), else a draw from p with the draft removed, so the token drawn has
  // sample()'s distribution. Greedy: the argmax, as sample().
  int32_t verify(std::span<const float> logits, int32_t draft);

 private:
  void candidates(std::span<const float> logits, std::vector<int32_t>& idx,
                  std::vector<double>& prob) const;
  SamplerParams p_;
  std::mt19937_64 rng_;
  std::vector<int32_t> idx_;
  std::vector<double> prob_;
};

}  // namespace engine
