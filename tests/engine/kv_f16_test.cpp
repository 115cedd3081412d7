// The KV cache in F16 (--kv-type f16, llama.cpp's default cache type): every architecture's
// logits within the golden README's F16 rule (max |d| <= 1.5e-2 on every row) of llama.cpp's
// F32-cache logits, greedy tokens reproduced, and the caches and saved states half the bytes.
#include <cmath>
#include <cstring>

#include "engine/engine.h"
#include "golden_util.h"
#include "test_util.h"

using namespace expertd::test;

namespace {

double max_row_diff(const Case& c, const std::vector<float>& mine) {
  EXPECT_EQ(mine.size(), c.logits.size());
  double mx = 0;
  for (size_t i = 0; i < std::min(mine.size(), c.logits.size()); ++i)
    mx = std::max(mx, std::fabs(double(mine[i]) - c.logits[i]));
  return mx;
}

// F16 against llama.cpp and against our F32 cache on one model: within the rule, really rounded
// (not the F32 cache's bits), half the cache, greedy the same.
void check_f16(const engine::Model& m, const Case& c, bool check_greedy) {
  auto src = engine::make_local_source(m);
  engine::Engine f32(m, *src, 2, 256), f16(m, *src, 2, 256, 1, engine::KvType::F16);
  const auto want = teacher_forced(f32, c, nullptr);
  const auto got = teacher_forced(f16, c, nullptr);
  const double d = max_row_diff(c, got);
  EXPECT_LE(d, 1.5e-2) << "f16 cache vs llama.cpp";
  EXPECT_NE(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
      << "the f16 cache gives the f32 cache's bits: it is not rounding";
  std::printf("%-28s f16 cache vs llama.cpp: max |d| %.2e; state per position %.0f -> %.0f bytes\n",
              c.id.c_str(), d, double(f32.cache_bytes()) / 256, double(f16.cache_bytes()) / 256);
  // The caches: every per-position row and the fixed ring/entries in half the bytes.
  EXPECT_LT(f16.cache_bytes(), f32.cache_bytes());
  EXPECT_GE(2 * f16.cache_bytes(), f32.cache_bytes());
  engine::SeqState s32, s16;
  ASSERT_TRUE(f32.save_state(0, s32));
  ASSERT_TRUE(f16.save_state(0, s16));
  EXPECT_LT(s16.bytes(), s32.bytes());
  if (check_greedy) {
    f16.reset();
    EXPECT_EQ(greedy(f16, c, c.greedy.size()), c.greedy);
  }
}

}  // namespace

TEST(KvF16, GoldenArchitecturesWithinTheF16Rule) {
  REQUIRE_GOLDEN();
  int n = 0;
  for (const std::string& id : golden_case_ids()) {
    if (!id.ends_with("f32") && !id.ends_with("f16")) continue;
    SCOPED_TRACE(id);
    Case c = load_case(id);
    auto l = load_golden(id);
    ASSERT_TRUE(l);
    check_f16(l->model, c, /*check_greedy=*/true);
    ++n;
  }
  EXPECT_GE(n, 12);
}

// DeepSeek-V4 (the window ring and the compressed entries in F16, the pending rows in F32) and
// Kimi-K3 (MLA latents in F16, the delta-attention states in F32).
TEST(KvF16, DeepseekV4AndKimiK3WithinTheF16Rule) {
  for (const char* id : {"deepseek4/v4-f32", "kimi-k3/k3-f32"}) {
    SCOPED_TRACE(id);
    Case c = load_case(id);
    auto l = load(c);
    ASSERT_TRUE(l);
    check_f16(l->model, c, /*check_greedy=*/true);
  }
}

// A GQA model's saved state is exactly half (no recurrent part): the prefix tiers hold twice
// the positions in the same bytes.
TEST(KvF16, AGqaStateIsHalfTheBytes) {
  REQUIRE_GOLDEN();
  const std::string id = "qwen3moe-A-s1-f32";
  Case c = load_case(id);
  auto l = load_golden(id);
  ASSERT_TRUE(l);
  auto src = engine::make_local_source(l->model);
  engine::Engine f32(l->model, *src, 2, 64), f16(l->model, *src, 2, 64, 1, engine::KvType::F16);
  EXPECT_EQ(2 * f16.cache_bytes(), f32.cache_bytes());
  std::vector<float> lg;
  ASSERT_TRUE(f32.eval(c.prompt, false, lg));
  ASSERT_TRUE(f16.eval(c.prompt, false, lg));
  engine::SeqState s32, s16;
  ASSERT_TRUE(f32.save_state(0, s32));
  ASSERT_TRUE(f16.save_state(0, s16));
  EXPECT_EQ(2 * s16.bytes(), s32.bytes());
  // A state of the other type does not fit.
  EXPECT_FALSE(f32.load_state(0, s16, s16.n_past));
  EXPECT_FALSE(f16.load_state(0, s32, s32.n_past));
}
