// Laguna (laguna) against llama.cpp: test-size synthetic models (tests/data/laguna: the
// expert-pack synth recipe and llama.cpp's teacher-forced logits, made by
// scripts/gen-laguna-cases.py with llama-cpp-python 0.3.36) in F32, F16 and Q4_K_M's mix: 4
// query heads on global layers and 8 on sliding ones, windows of 8, YaRN on the global layers over
// half of each head and plain RoPE over all of it on the sliding ones, per-head softplus gates, a
// dense lead layer, sigmoid routing beside a shared expert. The daemon path; chunked prefill; the
// window acting; the keys.
#include <gtest/gtest.h>

#include "engine/engine.h"
#include "golden_util.h"
#include "test_util.h"

using namespace expertd::test;

TEST(Laguna, SynthModelsMatchLlamaCpp) {
  for (const char* id : {"laguna/laguna-f32", "laguna/laguna-f16", "laguna/laguna-q4_k"})
    check_synth_case(id, "laguna");
}

TEST(Laguna, ChunkedPrefillEqualsOneBatch) {
  Case c = load_case("laguna/laguna-f32");
  auto l = load(c);
  ASSERT_TRUE(l);
  check_chunked_prefill(l->model, c, {1, 3, 7}, 1e-4);
}

TEST(Laguna, DaemonPathIsBitIdenticalToLocal) {
  check_daemon_path_is_local(load_case("laguna/laguna-q4_k"));
}

// The window acts: widened past the prompt, the rows of the first 8 positions (inside every
// window) stay bit for bit the same and the later ones change.
TEST(Laguna, TheSlidingWindowChangesTheLaterRows) {
  Case c = load_case("laguna/laguna-f32");
  TempDir d;
  const std::string model = synth_case(c, d), wide = d / "wide.gguf";
  write_with_u32(model, "laguna.attention.sliding_window", 8, 256, wide);
  if (HasFatalFailure()) return;
  check_rows_change_from(c, model, wide, 8);
}

TEST(Laguna, AMissingKeyIsAnErrorNamingIt) {
  check_missing_keys_are_named(load_case("laguna/laguna-f32"),
                               {"laguna.leading_dense_block_count", "laguna.attention.head_count"});
}
