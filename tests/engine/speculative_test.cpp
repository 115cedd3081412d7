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
#include "speculative_util.h"
#include "test_util.h"

using namespace expertd::test;

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

TEST(Speculative, DraftLengthGrowsWhileKeptFallsWhenRejectedAndPauses) {
  engine::DraftLength d(8);
  EXPECT_EQ(d.next(), 8);
  d.update(8, 3);  // the fourth rejected: one more than were kept
  EXPECT_EQ(d.next(), 4);
  d.update(4, 4);  // all kept: twice as many, up to the max
  EXPECT_EQ(d.next(), 8);
  d.update(8, 8);
  EXPECT_EQ(d.next(), 8);
  for (int i = 0; i < 4; ++i) d.update(d.next(), 0);  // four steps in a row keep none: a pause
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(d.next(), 0) << i;
    d.update(0, 0);
  }
  EXPECT_EQ(d.next(), 1);  // then one draft again
  engine::DraftLength off(0);
  EXPECT_EQ(off.next(), 0);
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
      const uint64_t a =
          check_greedy_identical(cpu_engine(l->model), l->model, doubled(c.prompt), 40, 4);
      std::printf("%s: %llu drafts kept\n", id.c_str(), static_cast<unsigned long long>(a));
      kept += a;
    }
  EXPECT_GT(kept, 0u) << "no draft was ever kept: the verify path went untested";
}

// The synthetic families (tests/data): identical where the caches can be cut, and where a layer
// keeps a recurrent state (Kimi-K3's and Qwen3.5's delta rules, DeepSeek-V4's compressors and
// window ring, Ling 3.0's linear attention: the state is restored and the kept tokens evaluated
// again), over 120 tokens there so that drafts are kept on each.
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
    const bool cut = cpu_engine(l->model)()->can_cut();  // no layer keeps a recurrent state
    const uint64_t a = check_greedy_identical(cpu_engine(l->model), l->model, doubled(c.prompt),
                                              cut ? 40 : 120, 5);
    std::printf("%s: %s, %llu drafts kept\n", id, cut ? "cut" : "recurrent",
                static_cast<unsigned long long>(a));
    if (!cut) {
      EXPECT_GT(a, 0u) << "no draft kept: restoring a recurrent state went untested";
    }
    kept += a, checked += cut;
  }
  EXPECT_EQ(checked, 15);
  EXPECT_GT(kept, 0u);
}
