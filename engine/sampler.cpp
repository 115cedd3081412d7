#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace engine {

int32_t Sampler::sample(std::span<const float> logits) {
  const int32_t n = static_cast<int32_t>(logits.size());
  if (p_.temperature <= 0.0f)
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  std::vector<int32_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  int32_t k = p_.top_k > 0 ? std::min(p_.top_k, n) : n;
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  idx.resize(k);
  std::vector<double> prob(k);
  const double mx = logits[idx[0]];
  double sum = 0;
  for (int32_t i = 0; i < k; ++i) sum += prob[i] = std::exp((logits[idx[i]] - mx) / p_.temperature);
  // Keep the smallest prefix whose mass reaches top_p.
  int32_t keep = k;
  if (p_.top_p < 1.0f) {
    double acc = 0;
    for (int32_t i = 0; i < k; ++i) {
      acc += prob[i] / sum;
      if (acc >= p_.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  std::discrete_distribution<int32_t> dist(prob.begin(), prob.begin() + keep);
  return idx[dist(rng_)];
}

}  // namespace engine
