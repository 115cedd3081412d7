// A sequence's state saved and resumed (what expert-serve's prefix reuse does): for every
// architecture, a prompt's state copied into another slot continues there with logits bit for
// bit those of the slot that evaluated the prompt; where no layer keeps a recurrent state, a
// longer state cut back to the prompt's positions resumes the same; elsewhere a cut is refused.
#include <gtest/gtest.h>

#include <cstring>

#include "engine/engine.h"
#include "golden_util.h"
#include "test_util.h"

using namespace expertd::test;

namespace {

std::vector<float> eval_in(engine::Engine& e, int slot, std::span<const int32_t> t) {
  std::vector<float> lg;
  const engine::SeqTokens s{slot, t};
  auto st = e.eval({&s, 1}, /*all_logits=*/true, lg);
  EXPECT_TRUE(st) << st.error().message;
  return lg;
}

void check_resume(const engine::Model& m, const Case& c, bool expect_cut,
                  engine::KvType kv = engine::KvType::F32) {
  auto src = engine::make_local_source(m);
  engine::Engine e(m, *src, 2, std::max(64, int(c.all.size()) + 8), 2, kv);
  ASSERT_EQ(e.can_cut(), expect_cut);
  const std::span<const int32_t> all(c.all);
  const size_t half = all.size() / 2;
  const auto a = all.subspan(0, half), b = all.subspan(half);
  // Reference: slot 0 evaluates the prompt, then the rest.
  eval_in(e, 0, a);
  engine::SeqState after_a;
  ASSERT_TRUE(e.save_state(0, after_a));
  EXPECT_EQ(after_a.n_past, int(half));
  const std::vector<float> want = eval_in(e, 0, b);
  // Resumed in slot 1 from the copy.
  ASSERT_TRUE(e.load_state(1, after_a, int(half)));
  EXPECT_EQ(e.n_past(1), int(half));
  const std::vector<float> got = eval_in(e, 1, b);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
      << "resumed logits differ";
  // The whole sequence's state cut back to the prompt.
  engine::SeqState after_all;
  ASSERT_TRUE(e.save_state(0, after_all));
  auto cut = e.load_state(1, after_all, int(half));
  if (!expect_cut) {
    ASSERT_FALSE(cut);
    EXPECT_NE(cut.error().message.find("recurrent"), std::string::npos);
    return;
  }
  ASSERT_TRUE(cut) << cut.error().message;
  const std::vector<float> again = eval_in(e, 1, b);
  EXPECT_EQ(std::memcmp(again.data(), want.data(), again.size() * sizeof(float)), 0)
      << "logits after a cut differ";
}

}  // namespace

TEST(SeqState, EveryGoldenArchitectureResumesBitForBit) {
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
      check_resume(*model, c, /*expect_cut=*/true);
      check_resume(*model, c, /*expect_cut=*/true, engine::KvType::F16);
    }
}

// DeepSeek-V3.2 and GLM-5: the lightning indexer's keys are cached beside the latent rows;
// MiniMax-M3: its indexer's keys after the keys of each key row. So a resumed (or cut) sequence
// selects the same positions: bit for bit, in F32 and F16 caches.
TEST(SeqState, SparseAttentionModelsResumeAndCutBitForBit) {
  for (const char* id : {"dsa/ds32-f32", "dsa/glm5-q4_k", "minimax/m3-q4_k"}) {
    SCOPED_TRACE(id);
    Case c = load_case(id);
    auto l = load(c);
    ASSERT_TRUE(l);
    check_resume(l->model, c, /*expect_cut=*/true);
    check_resume(l->model, c, /*expect_cut=*/true, engine::KvType::F16);
  }
}

// The grouped-query families of issue 45, windows (K-EXAONE) and chunks (Llama 4) included:
// their key and value rows resume and cut bit for bit, in F32 and F16 caches.
TEST(SeqState, GroupedQueryFamiliesResumeAndCutBitForBit) {
  for (const char* id :
       {"minimax/m2-q4_k", "ling/ling-q4_k", "ernie/ernie-q4_k", "exaone/exaone-q4_k",
        "llama4/l4-q4_k", "hy3/hy3-q4_k", "trinity/trinity-q4_k"}) {
    SCOPED_TRACE(id);
    Case c = load_case(id);
    auto l = load(c);
    ASSERT_TRUE(l);
    check_resume(l->model, c, /*expect_cut=*/true);
    check_resume(l->model, c, /*expect_cut=*/true, engine::KvType::F16);
  }
}

// Kimi-K3 (delta-attention and convolution states), DeepSeek-V4 (window ring, compressors'
// pending rows and entries), Qwen3.5 and Qwen3-Next (gated delta-net states beside full
// attention's KV rows), Ling 3.0 (KDA states beside latent rows): exact resumes, no cuts.
TEST(SeqState, RecurrentModelsResumeBitForBitButDoNotCut) {
  for (const char* id : {"kimi-k3/k3-q8_0", "deepseek4/v4-f32", "qwen35/q35-q4_k",
                         "qwen35/next-f32", "ling3/ling3-q4_k"}) {
    SCOPED_TRACE(id);
    Case c = load_case(id);
    auto l = load(c);
    ASSERT_TRUE(l);
    check_resume(l->model, c, /*expect_cut=*/false);
    check_resume(l->model, c, /*expect_cut=*/false, engine::KvType::F16);
  }
}

TEST(SeqState, AStateOfAnotherShapeIsRefused) {
  Case c = load_case("kimi-k3/k3-f32");
  auto l = load(c);
  ASSERT_TRUE(l);
  auto src = engine::make_local_source(l->model);
  engine::Engine e(l->model, *src, 2, 16, 1);
  engine::SeqState bogus;
  bogus.n_past = 3;
  bogus.data.assign(40, 0);
  auto st = e.load_state(0, bogus, 3);
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("does not fit"), std::string::npos);
  EXPECT_FALSE(e.load_state(0, bogus, 2));  // a cut of a recurrent model
  EXPECT_FALSE(e.load_state(3, bogus, 3));  // no such slot
}
