#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace engine {

// The tokens that can be drawn and their unnormalised probabilities: the top_k most likely,
// exp((logit - max) / temperature), cut to the smallest prefix whose mass reaches top_p.
void Sampler::candidates(std::span<const float> logits, std::vector<int32_t>& idx,
                         std::vector<double>& prob) const {
  const int32_t n = static_cast<int32_t>(logits.size());
  idx.resize(size_t(n));
  std::iota(idx.begin(), idx.end(), 0);
  int32_t k = p_.top_k > 0 ? std::min(p_.top_k, n) : n;
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  idx.resize(size_t(k));
  prob.resize(size_t(k));
  const double mx = logits[idx[0]];
  double sum = 0;
  for (int32_t i = 0; i < k; ++i) sum += prob[i] = std::exp((logits[idx[i]] - mx) / p_.temperature);
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
  idx.resize(size_t(keep));
  prob.resize(size_t(keep));
}

static int32_t argmax(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

int32_t Sampler::sample(std::span<const float> logits) {
  if (p_.temperature <= 0.0f) return argmax(logits);
  candidates(logits, idx_, prob_);
  std::discrete_distribution<int32_t> dist(prob_.begin(), prob_.end());
  return idx_[size_t(dist(rng_))];
}

int32_t Sampler::verify(std::span<const float> logits, int32_t draft) {
  if (p_.temperature <= 0.0f) return argmax(logits);
  candidates(logits, idx_, prob_);
  const double total = std::accumulate(prob_.begin(), prob_.end(), 0.0);
  const auto at = std::find(idx_.begin(), idx_.end(), draft);
  if (at != idx_.end()) {
    const double p = prob_[size_t(at - idx_.begin())] / total;
    if (std::uniform_real_distribution<double>(0.0, 1.0)(rng_) < p) return draft;
    // Rejected: the residual max(0, p - q) with q the point mass on the draft is p without it.
    prob_[size_t(at - idx_.begin())] = 0.0;  // (p < 1 here: another candidate has mass)
  }
  std::discrete_distribution<int32_t> dist(prob_.begin(), prob_.end());
  return idx_[size_t(dist(rng_))];
}

}  // namespace engine
