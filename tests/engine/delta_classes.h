// The shape classes of the delta rule (engine::DeltaOpts) both its tests run: against float64 on
// the CPU (engine/delta_rule_test.cpp) and GPU against CPU (gpu/ops_sweep_test.cpp).
#pragma once

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "engine/ops.h"

namespace expertd::test {

// n values of a normal distribution, seeded: the same inputs on every backend and run.
inline std::vector<float> normal(size_t n, uint32_t seed, float sd = 1.0f, float mean = 0.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(mean, sd);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

struct DeltaClass {
  std::string name;
  int hk, hv;
  int64_t dk, dv;
  bool per_head;
  float lower;
  bool tiled = false;       // value head h reads key head h % hk (Qwen3.5), else h / (hv / hk)
  bool a_positive = false;  // a holds exp(A_log) (Ling 3.0), else -exp(A_log)
  // Its options without the tensors (d_conv taps).
  engine::DeltaOpts opts(int d_conv) const {
    engine::DeltaOpts o;
    o.n_k_head = hk, o.n_v_head = hv, o.dk = dk, o.dv = dv, o.per_head_decay = per_head;
    o.tiled_heads = tiled, o.a_positive = a_positive;
    o.d_conv = d_conv, o.lower_bound = lower, o.eps = 1e-6f;
    return o;
  }
};

// KDA (a decay per key dimension) with both gates (the bounded one with a stored either sign); the
// gated delta-net (a decay per head, 2 key heads for 4 value heads of another size), its value
// heads grouped (Qwen3-Next) and tiled (Qwen3.5: value head h reads key head h % 2).
inline std::vector<DeltaClass> delta_classes() {
  return {{"kda softplus gate", 2, 2, 32, 32, false, -INFINITY},
          {"kda bounded gate", 2, 2, 32, 32, false, -5.0f},
          {"kda bounded gate, a = exp(A_log)", 2, 2, 32, 32, false, -5.0f, false, true},
          {"gated delta-net", 2, 4, 32, 48, true, -INFINITY},
          {"gated delta-net, tiled heads", 2, 4, 32, 32, true, -INFINITY, true}};
}

}  // namespace expertd::test
