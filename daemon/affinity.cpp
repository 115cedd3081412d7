#include "daemon/affinity.h"

#include <algorithm>
#include <cmath>

namespace expertd::daemon {

namespace {
uint32_t ahead_within(uint32_t layers, uint32_t experts, size_t budget) {
  const size_t per_layer_ahead = std::max<size_t>(1, size_t{layers} * experts * experts * 2);
  const size_t most =
      std::clamp<size_t>(size_t{layers} - (layers > 0), 1, Affinity::kMaxLayersAhead);
  return static_cast<uint32_t>(std::clamp<size_t>(budget / per_layer_ahead, 1, most));
}
}  // namespace

Affinity::Affinity(uint32_t layers, uint32_t experts, size_t budget_bytes)
    : L_(layers),
      X_(experts),
      ahead_(ahead_within(layers, experts, budget_bytes)),
      base_(size_t{layers} * experts, 0),
      seen_(size_t{layers} * experts * ahead_, 0),
      co_(size_t{layers} * experts * ahead_ * experts, 0) {}

void Affinity::record(uint32_t client, uint32_t layer, std::span<const uint32_t> experts) {
  auto [it, fresh] = steps_of_.try_emplace(client);
  Step& s = it->second;
  if (fresh) s.used.resize(L_);
  if (!fresh && layer < s.last_layer) end_step(s);
  s.last_layer = layer;
  auto& u = s.used[layer];
  u.insert(u.end(), experts.begin(), experts.end());
  std::sort(u.begin(), u.end());
  u.erase(std::unique(u.begin(), u.end()), u.end());
}

int64_t Affinity::step_layer(uint32_t client) const {
  auto it = steps_of_.find(client);
  return it == steps_of_.end() ? -1 : int64_t{it->second.last_layer};
}

void Affinity::end_step(Step& s) {
  ++steps_;
  for (uint32_t l = 0; l < L_; ++l)
    for (uint32_t e : s.used[l]) {
      ++base_[size_t{l} * X_ + e];
      for (uint32_t d = 1; d <= ahead_ && l + d < L_; ++d) {
        const auto& later = s.used[l + d];
        if (later.empty()) continue;
        const size_t c = cell(l, e, d);
        ++seen_[c];
        uint16_t* row = &co_[c * X_];
        for (uint32_t f : later)
          if (++row[f] == UINT16_MAX) {  // halve the row and its total: the ratios stay
            for (uint32_t g = 0; g < X_; ++g) row[g] /= 2;
            seen_[c] /= 2;
          }
      }
    }
  for (auto& u : s.used) u.clear();
}

double Affinity::chance(uint32_t client, uint32_t layer, uint32_t expert) const {
  const double p0 = (base_[size_t{layer} * X_ + expert] + 0.5) / (double(steps_) + 1.0);
  const double odds0 = std::log(p0 / (1 - p0));
  double logit = odds0;
  bool evidence = false;
  if (auto it = steps_of_.find(client); it != steps_of_.end())
    for (uint32_t d = 1; d <= ahead_ && d <= layer; ++d)
      for (uint32_t e : it->second.used[layer - d]) {
        const size_t c = cell(layer - d, e, d);
        if (seen_[c] == 0) continue;
        double p = (co_[c * X_ + expert] + 2 * p0) / (seen_[c] + 2.0);
        p = std::clamp(p, 1e-4, 1 - 1e-4);
        logit += std::log(p / (1 - p)) - odds0;
        evidence = true;
      }
  return evidence ? 1 / (1 + std::exp(-logit)) : p0;
}

}  // namespace expertd::daemon
