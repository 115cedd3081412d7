// Speculative decoding's check, shared by the CPU and the GPU engine tests: greedy decoding with
// n-gram drafts is plain decoding, token for token and logit for logit.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>

#include "engine/engine.h"
#include "engine/speculative.h"

namespace expertd::test {

inline int32_t argmax(const float* x, size_t n) {
  return static_cast<int32_t>(std::max_element(x, x + n) - x);
}

// Greedy decoding of n tokens after `prompt`, one token per eval (the plain path) and with drafts
// of up to `draft_max` (n-gram, or the drafter's): the same tokens, and every token drawn from
// bit-identical logits. Returns the drafts kept (0 where the model's caches cannot be cut: the step
// refuses, by name).
inline uint64_t check_greedy_identical(const std::function<std::unique_ptr<engine::Engine>()>& make,
                                       const engine::Model& m, const std::vector<int32_t>& prompt,
                                       int n, int draft_max, engine::Drafter drafter = {}) {
  const size_t V = size_t(m.hp.n_vocab);
  std::vector<int32_t> plain;
  std::vector<std::vector<float>> plain_rows;
  {
    auto pe = make();
    engine::Engine& e = *pe;
    std::vector<float> lg;
    auto st = e.eval(prompt, false, lg);
    EXPECT_TRUE(st) << (st ? "" : st.error().message);
    for (int i = 0; i < n; ++i) {
      const int32_t t = argmax(lg.data(), V);
      plain.push_back(t), plain_rows.push_back(lg);
      EXPECT_TRUE(e.eval({&t, 1}, false, lg));
    }
  }
  auto pe = make();
  engine::Engine& e = *pe;
  std::vector<float> lg;
  EXPECT_TRUE(e.eval(prompt, false, lg));
  std::vector<int32_t> history = prompt;
  history.push_back(argmax(lg.data(), V));
  std::vector<int32_t> spec{history.back()};
  EXPECT_EQ(0, std::memcmp(lg.data(), plain_rows[0].data(), V * 4));
  engine::Sampler greedy({.temperature = 0.0f});
  engine::DraftStats stats;
  engine::DraftLength len(draft_max);
  engine::DraftStep step;
  while (spec.size() < size_t(n)) {
    auto st = engine::speculative_step(e, 0, history, drafter, len, greedy, stats, step);
    EXPECT_TRUE(st) << (st ? "" : st.error().message);
    if (!st) return 0;
    EXPECT_EQ(step.emitted.size(), size_t(step.accepted) + 1);
    for (size_t i = 0; i < step.emitted.size() && spec.size() < size_t(n); ++i) {
      const size_t at = spec.size();
      EXPECT_EQ(0, std::memcmp(step.logits.data() + i * V, plain_rows[at].data(), V * 4))
          << "the logits of token " << at << " differ from one-token decoding";
      spec.push_back(step.emitted[i]);
    }
    history.insert(history.end(), step.emitted.begin(), step.emitted.end());
    EXPECT_EQ(size_t(e.n_past()), history.size() - 1);
  }
  EXPECT_EQ(spec, plain);
  EXPECT_LE(stats.accepted, stats.drafted);
  EXPECT_EQ(stats.emitted, stats.steps + stats.accepted);
  return stats.accepted;
}

// The case's prompt twice: what a random-weight model's greedy loops and the repeat give prompt
// lookup to find.
inline std::vector<int32_t> doubled(const std::vector<int32_t>& prompt) {
  std::vector<int32_t> p = prompt;
  p.insert(p.end(), prompt.begin(), prompt.end());
  return p;
}

// A CPU engine of 512 positions over the model's own experts.
inline std::function<std::unique_ptr<engine::Engine>()> cpu_engine(const engine::Model& m) {
  auto src = std::shared_ptr<engine::ExpertSource>(engine::make_local_source(m));
  return [&m, src] { return std::make_unique<engine::Engine>(m, *src, 2, 512); };
}

}  // namespace expertd::test
