// Batched evaluation (Engine::eval over several sequences, what expert-serve's continuous
// batching runs): every architecture gives each sequence the logits it gets alone, bit for bit,
// whether its rows are a prefill beside others' decode steps, it joins late, or it reuses the
// slot of a sequence that finished.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>

#include "engine/engine.h"
#include "golden_util.h"
#include "test_util.h"

using namespace expertd::test;

namespace {

std::function<std::unique_ptr<engine::Engine>(int)> cpu_engines(const engine::Model& m) {
  auto src = std::shared_ptr<engine::ExpertSource>(engine::make_local_source(m));
  return [&m, src](int n_seq) { return std::make_unique<engine::Engine>(m, *src, 2, 64, n_seq); };
}

}  // namespace

TEST(Batch, EveryGoldenArchitectureGivesEachSequenceItsLogitsAlone) {
  REQUIRE_GOLDEN();
  for (const char* arch : kGoldenArchs)
    for (const char* variant : {"A-s1-f32", "B-s11-q4_k_m"}) {
      const std::string id = std::string(arch) + "-" + variant;
      SCOPED_TRACE(id);
      Case c = load_case(id);
      auto file = gguf::Model::open(golden_model(id));
      ASSERT_TRUE(file);
      auto model = engine::Model::load(*file);
      ASSERT_TRUE(model) << model.error().message;
      check_batched_equals_alone(*model, c, cpu_engines(*model));
    }
}

// Kimi-K3 (delta-attention state per sequence, attention residuals) and DeepSeek-V4 (window
// ring, compressors, indexer, hash routing by each row's token).
TEST(Batch, KimiK3AndDeepseekV4GiveEachSequenceItsLogitsAlone) {
  for (const char* id : {"kimi-k3/k3-q8_0", "deepseek4/v4-f32", "deepseek4/v4-mxfp4"}) {
    SCOPED_TRACE(id);
    Case c = load_case(id);
    auto l = load(c);
    ASSERT_TRUE(l);
    check_batched_equals_alone(l->model, c, cpu_engines(l->model));
  }
}

TEST(Batch, BadBatchesAreErrors) {
  Case c = load_case("kimi-k3/k3-f32");
  auto l = load(c);
  ASSERT_TRUE(l);
  auto src = engine::make_local_source(l->model);
  engine::Engine e(l->model, *src, 2, 16, 2);
  std::vector<int32_t> t = {1, 2, 3};
  std::vector<float> lg;
  auto msg = [&](std::vector<engine::SeqTokens> b) {
    auto r = e.eval(b, lg);
    return r ? std::string() : r.error().message;
  };
  EXPECT_NE(msg({{2, t}}).find("sequence 2 is not one of the 2"), std::string::npos);
  EXPECT_NE(msg({{1, t}, {1, t}}).find("appears twice"), std::string::npos);
  EXPECT_NE(msg({}).find("no sequences"), std::string::npos);
  std::vector<int32_t> long_t(17, 1);
  EXPECT_NE(msg({{0, t}, {1, long_t}}).find("exceed the context of 16"), std::string::npos);
  // A refused batch changes no sequence: both still start at position 0.
  EXPECT_EQ(e.n_past(0), 0);
  EXPECT_EQ(e.n_past(1), 0);
  const std::vector<engine::SeqTokens> both = {{0, t}, {1, t}};
  EXPECT_TRUE(e.eval(both, lg));
  EXPECT_EQ(e.n_past(0), 3);
  EXPECT_EQ(e.n_past(1), 3);
}
