// Step 3.5 (step35) against llama.cpp: test-size synthetic models (tests/data/step: the
// expert-pack synth recipe and llama.cpp's teacher-forced logits, made by
// scripts/gen-step-cases.py with llama-cpp-python 0.3.36) in F32, F16 and Q4_K_M's mix: 4 query
// heads on global layers and 8 on sliding ones, windows of 8, half of each head rotated on global
// layers and all of it on sliding ones, per-head sigmoid gates, a dense lead layer, sigmoid
// routing beside a shared expert with SwiGLU clamps (routed 2, shared 1.5), 3 MTP blocks in the
// file. The daemon path; chunked prefill; the window acting; the clamps acting; the keys.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "engine/engine.h"
#include "golden_util.h"
#include "test_util.h"

using namespace expertd::test;

TEST(Step35, SynthModelsMatchLlamaCpp) {
  for (const char* id : {"step/step-f32", "step/step-f16", "step/step-q4_k"})
    check_synth_case(id, "step35");
}

TEST(Step35, ChunkedPrefillEqualsOneBatch) {
  Case c = load_case("step/step-f32");
  auto l = load(c);
  ASSERT_TRUE(l);
  check_chunked_prefill(l->model, c, {1, 3, 7}, 1e-4);
}

TEST(Step35, DaemonPathIsBitIdenticalToLocal) {
  check_daemon_path_is_local(load_case("step/step-q4_k"));
}

// The window acts: widened past the prompt, the rows of the first 8 positions (inside every
// window) stay bit for bit the same and the later ones change.
TEST(Step35, TheSlidingWindowChangesTheLaterRows) {
  Case c = load_case("step/step-f32");
  TempDir d;
  const std::string model = synth_case(c, d), wide = d / "wide.gguf";
  write_with_u32(model, "step35.attention.sliding_window", 8, 256, wide);
  if (HasFatalFailure()) return;
  check_rows_change_from(c, model, wide, 8);
}

TEST(Step35, AMissingKeyIsAnErrorNamingIt) {
  check_missing_keys_are_named(
      load_case("step/step-f32"),
      {"step35.attention.sliding_window_pattern", "step35.attention.head_count_kv",
       "step35.attention.sliding_window"});
}

// The clamps act: without swiglu_clamp_exp (or _shexp) the logits change; they are not inert at
// this size.
TEST(Step35, TheClampsAct) {
  Case c = load_case("step/step-f32");
  TempDir d;
  const std::string model = synth_case(c, d);
  const auto with = case_logits_of(c, model);
  for (const char* key : {"step35.swiglu_clamp_exp", "step35.swiglu_clamp_shexp"}) {
    SCOPED_TRACE(key);
    const std::string without = d / "without.gguf";
    ASSERT_TRUE(write_without_key(model, key, without));
    const auto other = case_logits_of(c, without);
    ASSERT_EQ(other.size(), with.size());
    double mx = 0;
    for (size_t i = 0; i < with.size(); ++i)
      mx = std::max(mx, std::fabs(double(with[i]) - other[i]));
    EXPECT_GT(mx, 1e-3);
  }
}
