// K-EXAONE (exaone-moe) against llama.cpp: test-size synthetic models (tests/data/exaone: the
// expert-pack synth recipe and llama.cpp's teacher-forced logits, made by
// scripts/gen-exaone-cases.py with llama-cpp-python 0.3.36) in F32, F16 and Q4_K_M's mix:
// sliding windows of 8 positions on rotated layers and global layers with no position encoding,
// so that a 40-token prompt slides past the windows; a dense lead layer, sigmoid routing beside a
// shared expert, the MTP layer in the file. The daemon path; the window across evals; the keys.
#include <gtest/gtest.h>

#include "engine/engine.h"
#include "golden_util.h"
#include "test_util.h"

using namespace expertd::test;

TEST(KExaone, SynthModelsMatchLlamaCpp) {
  for (const char* id : {"exaone/exaone-f32", "exaone/exaone-f16", "exaone/exaone-q4_k"})
    check_synth_case(id, "exaone-moe");
}

TEST(KExaone, ChunkedPrefillEqualsOneBatch) {
  Case c = load_case("exaone/exaone-f32");
  auto l = load(c);
  ASSERT_TRUE(l);
  check_chunked_prefill(l->model, c, {1, 3, 7}, 1e-4);
}

TEST(KExaone, DaemonPathIsBitIdenticalToLocal) {
  check_daemon_path_is_local(load_case("exaone/exaone-q4_k"));
}

// The window acts: widened past the prompt, the rows of the first 8 positions (inside every
// window) stay bit for bit the same and the later ones change.
TEST(KExaone, TheSlidingWindowChangesTheLaterRows) {
  Case c = load_case("exaone/exaone-f32");
  TempDir d;
  const std::string model = synth_case(c, d), wide = d / "wide.gguf";
  write_with_u32(model, "exaone-moe.attention.sliding_window", 8, 256, wide);
  if (HasFatalFailure()) return;
  check_rows_change_from(c, model, wide, 8);
}

TEST(KExaone, AMissingKeyIsAnErrorNamingIt) {
  check_missing_keys_are_named(
      load_case("exaone/exaone-f32"),
      {"exaone-moe.attention.sliding_window", "exaone-moe.expert_gating_func"});
}
