// Trinity (afmoe) against llama.cpp: test-size synthetic models (tests/data/trinity: the
// expert-pack synth recipe and llama.cpp's teacher-forced logits, made by
// scripts/gen-trinity-cases.py with llama-cpp-python 0.3.36) in F32, F16 and Q4_K_M's mix:
// muP-scaled embeddings, the sigmoid-gated attention output, sandwich norms, windows of 8 on three
// layers of four and no RoPE on the fourth (a 40-token prompt slides past the windows), a dense
// lead layer, sigmoid routing beside a shared expert. The daemon path; chunked prefill; the window
// acting; the keys.
#include <gtest/gtest.h>

#include "engine/engine.h"
#include "golden_util.h"
#include "test_util.h"

using namespace expertd::test;

TEST(Trinity, SynthModelsMatchLlamaCpp) {
  for (const char* id : {"trinity/trinity-f32", "trinity/trinity-f16", "trinity/trinity-q4_k"})
    check_synth_case(id, "afmoe");
}

TEST(Trinity, ChunkedPrefillEqualsOneBatch) {
  Case c = load_case("trinity/trinity-f32");
  auto l = load(c);
  ASSERT_TRUE(l);
  check_chunked_prefill(l->model, c, {1, 3, 7}, 1e-4);
}

TEST(Trinity, DaemonPathIsBitIdenticalToLocal) {
  check_daemon_path_is_local(load_case("trinity/trinity-q4_k"));
}

// The window acts: widened past the prompt, the rows of the first 8 positions (inside every
// window) stay bit for bit the same and the later ones change.
TEST(Trinity, TheSlidingWindowChangesTheLaterRows) {
  Case c = load_case("trinity/trinity-f32");
  TempDir d;
  const std::string model = synth_case(c, d), wide = d / "wide.gguf";
  write_with_u32(model, "afmoe.attention.sliding_window", 8, 256, wide);
  if (HasFatalFailure()) return;
  check_rows_change_from(c, model, wide, 8);
}

TEST(Trinity, AMissingKeyIsAnErrorNamingIt) {
  check_missing_keys_are_named(load_case("trinity/trinity-f32"),
                               {"afmoe.expert_shared_count", "afmoe.expert_count"});
}
