// Ling 3.0 (bailingmoe3) against llama.cpp: test-size synthetic models (tests/data/ling3: the
// expert-pack synth recipe and llama.cpp's teacher-forced logits, made by
// scripts/gen-ling3-cases.py with llama-cpp-python 0.3.36) in F32, F16 and Q4_K_M's mix: KDA
// layers with the decay rate stored as exp(A_log), latent attention with RoPE and a sigmoid gate
// per head, a dense lead layer, grouped sigmoid routing beside a shared expert, SwiGLU clamps, a
// NextN block that is skipped. Its recurrent state across eval calls; the daemon path; the keys.
#include <gtest/gtest.h>

#include "engine/engine.h"
#include "golden_util.h"
#include "test_util.h"

using namespace expertd::test;

TEST(Ling3, SynthModelsMatchLlamaCpp) {
  for (const char* id : {"ling3/ling3-f32", "ling3/ling3-f16", "ling3/ling3-q4_k"})
    check_synth_case(id, "bailingmoe3");
}

// KDA layers carry their convolution and delta-rule state from one eval to the next.
TEST(Ling3, ChunkedPrefillEqualsOneBatch) {
  Case c = load_case("ling3/ling3-f32");
  auto l = load(c);
  ASSERT_TRUE(l);
  check_chunked_prefill(l->model, c, {1, 3, 5}, 1e-5);
  check_state_matters(l->model, c);
}

TEST(Ling3, DaemonPathIsBitIdenticalToLocal) {
  check_daemon_path_is_local(load_case("ling3/ling3-q4_k"));
}

// llama.cpp asserts a negative gate bound and reads the gating function; the KDA sizes are
// required.
TEST(Ling3, AMissingKeyIsAnErrorNamingIt) {
  check_missing_keys_are_named(load_case("ling3/ling3-f32"),
                               {"bailingmoe3.expert_gating_func", "bailingmoe3.kda.head_dim",
                                "bailingmoe3.kda.gate_lower_bound", "bailingmoe3.ssm.conv_kernel",
                                "bailingmoe3.attention.kv_lora_rank"});
}
