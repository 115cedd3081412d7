// Speculative decoding (engine/speculative.h): greedy output with n-gram drafts is the plain
// decoder's, token for token and logit for logit, on every architecture whose caches can be cut;
// the acceptance rule keeps the sampler's distribution; prompt lookup finds what repeats.
#include "engine/speculative.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>

#include "engine/engine.h"
#include "golden_util.h"
#include "test_util.h"

using namespace expertd::test;

namespace {

int32_t argmax(const float* x, size_t n) {
  return static_cast<int32_t>(std::max_element(x, x + n) - x);
}

// Greedy decoding of n tokens after `prompt`, one token per eval (the plain path) and with n-gram
// drafts of up to `draft_max`: the same tokens, and every token drawn from bit-identical logits.
// Returns the drafts kept (0 where the model's caches cannot be cut: the step refuses, by name).
uint64_t check_greedy_identical(const engine::Model& m, const std::vector<int32_t>& prompt, int n,
                                int draft_max) {
  auto src = engine::make_local_source(m);
  const size_t V = size_t(m.hp.n_vocab);
  std::vector<int32_t> plain;
  std::vector<std::vector<float>> plain_rows;
  {
    engine::Engine e(m, *src, 2, 512);
    std::vector<float> lg;
    auto st = e.eval(prompt, false, lg);
    EXPECT_TRUE(st) << (st ? "" : st.error().message);
    for (int i = 0; i < n; ++i) {
      const int32_t t = argmax(lg.data(), V);
      plain.push_back(t), plain_rows.push_back(lg);
      EXPECT_TRUE(e.eval({&t, 1}, false, lg));
    }
  }
  engine::Engine e(m, *src, 2, 512);
  std::vector<float> lg;
  EXPECT_TRUE(e.eval(prompt, false, lg));
  std::vector<int32_t> history = prompt;
  history.push_back(argmax(lg.data(), V));
  std::vector<int32_t> spec{history.back()};
  EXPECT_EQ(0, std::memcmp(lg.data(), plain_rows[0].data(), V * 4));
  engine::Sampler greedy({.temperature = 0.0f});
  engine::NgramDrafter drafter;
  engine::DraftStats stats;
  engine::DraftStep step;
  while (spec.size() < size_t(n)) {
    auto st = engine::speculative_step(e, 0, history, drafter, draft_max, greedy, stats, step);
    if (!e.can_cut()) {
      EXPECT_FALSE(st);
      if (!st) {
        EXPECT_NE(st.error().message.find("recurrent"), std::string::npos);
      }
      return 0;
    }
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
std::vector<int32_t> doubled(const Case& c) {
  std::vector<int32_t> p = c.prompt;
  p.insert(p.end(), c.prompt.begin(), c.prompt.end());
  return p;
}

}  // namespace

TEST(Speculative, NgramDraftsFollowTheLatestEarlierOccurrenceOfTheLongestSuffix) {
  engine::NgramDrafter d;  // suffixes of 4 down to 2 tokens
  std::vector<int32_t> h = {1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3};
  EXPECT_EQ(d.draft(h, 3), (std::vector<int32_t>{7, 8, 5}));  // the latest "1 2 3", not the first
  EXPECT_EQ(d.draft(h, 1), (std::vector<int32_t>{7}));
  EXPECT_TRUE(d.draft(h, 0).empty());
  // "5 1 2 3" (4 tokens) recurs nowhere, "1 2 3" does; a longer match wins over a later shorter.
  h = {4, 2, 3, 6, 1, 2, 3, 5, 0, 2, 3, 7, 1, 2, 3};
  EXPECT_EQ(d.draft(h, 2), (std::vector<int32_t>{5, 0}));
  // The drafts stop where the history does.
  h = {5, 6, 7, 5, 6};
  EXPECT_EQ(d.draft(h, 8), (std::vector<int32_t>{7, 5, 6}));
  EXPECT_TRUE(d.draft(std::vector<int32_t>{1, 2, 3, 4}, 4).empty());  // nothing repeats
  EXPECT_TRUE(d.draft(std::vector<int32_t>{1}, 4).empty());
}

// The acceptance rule draws from the sampler's own distribution whatever the draft: 200,000 draws
// with a likely, an unlikely and an excluded (outside top-k) draft, each token's frequency within
// 5 standard errors of its probability.
TEST(Speculative, AcceptanceRuleKeepsTheSamplersDistribution) {
  const std::vector<float> logits = {2.0f, 1.0f, 0.5f, -1.0f, 0.0f, -3.0f};
  const engine::SamplerParams sp{.temperature = 0.7f, .top_k = 5, .top_p = 1.0f, .seed = 42};
  std::vector<double> p(logits.size(), 0.0);
  double sum = 0;
  for (size_t i = 0; i < logits.size(); ++i)
    if (i != 5) sum += p[i] = std::exp((logits[i] - 2.0) / 0.7);  // top-5 drops token 5
  for (double& x : p) x /= sum;
  for (int32_t draft : {0, 3, 5}) {
    SCOPED_TRACE(draft);
    engine::Sampler s(sp);
    const int N = 200000;
    std::map<int32_t, int> count;
    for (int i = 0; i < N; ++i) ++count[s.verify(logits, draft)];
    for (size_t t = 0; t < logits.size(); ++t) {
      const double f = double(count[int32_t(t)]) / N;
      const double se = std::sqrt(std::max(p[t] * (1 - p[t]), 1e-12) / N);
      EXPECT_NEAR(f, p[t], 5 * se + 1e-9) << "token " << t;
    }
  }
  // Greedy: the argmax, whatever was drafted.
  engine::Sampler g({.temperature = 0.0f});
  EXPECT_EQ(g.verify(logits, 3), 0);
}

TEST(Speculative, GreedyIsIdenticalOnEveryGoldenArchitecture) {
  REQUIRE_GOLDEN();
  uint64_t kept = 0;
  for (const char* arch : kGoldenArchs)
    for (const char* variant : {"A-s1-f32", "A-s1-f16", "B-s11-q4_k_m"}) {
      const std::string id = std::string(arch) + "-" + variant;
      SCOPED_TRACE(id);
      Case c = load_case(id);
      auto l = load_golden(id);
      ASSERT_TRUE(l);
      const uint64_t a = check_greedy_identical(l->model, doubled(c), 40, 4);
      std::printf("%s: %llu drafts kept\n", id.c_str(), static_cast<unsigned long long>(a));
      kept += a;
    }
  EXPECT_GT(kept, 0u) << "no draft was ever kept: the verify path went untested";
}

// The synthetic families (tests/data): identical where the caches can be cut; refused by name
// where a layer keeps a recurrent state.
TEST(Speculative, GreedyIsIdenticalOnTheNewerFamilies) {
  uint64_t kept = 0;
  int checked = 0;
  for (const char* id :
       {"dsa/ds32-f32", "dsa/glm5-q4_k", "ernie/ernie-f32", "exaone/exaone-q4_k", "hy3/hy3-f32",
        "laguna/laguna-f32", "ling/ling-q4_k", "llama4/l4-k2-f32", "llama4/l4-q4_k",
        "mimo/mimo-f32", "minimax/m2-q4_k", "minimax/m3-f32", "mistral3/ml3-q4_k", "step/step-f32",
        "trinity/trinity-f32", "kimi-k3/k3-f32", "qwen35/q35-f16", "deepseek4/v4-f32",
        "ling3/ling3-f32"}) {
    SCOPED_TRACE(id);
    Case c = load_case(id);
    auto l = load(c);
    ASSERT_TRUE(l);
    auto probe_src = engine::make_local_source(l->model);
    engine::Engine probe(l->model, *probe_src, 1, 8);
    const uint64_t a = check_greedy_identical(l->model, doubled(c), 40, 5);
    std::printf("%s: %s, %llu drafts kept\n", id, probe.can_cut() ? "cut" : "recurrent",
                static_cast<unsigned long long>(a));
    kept += a, checked += probe.can_cut();
  }
  EXPECT_GE(checked, 13);
  EXPECT_GT(kept, 0u);
}
