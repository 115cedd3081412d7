// Ling 2.0 (bailingmoe2) against llama.cpp: test-size synthetic models (tests/data/ling: the
// expert-pack synth recipe and llama.cpp's teacher-forced logits, made by
// scripts/gen-ling-cases.py with llama-cpp-python 0.3.36) in F32, F16 and Q4_K_M's mix: the fused
// QKV projection, per-head q/k norms, partial rotary, a dense lead layer, grouped sigmoid routing
// with a shared expert. The daemon path; the keys.
#include <gtest/gtest.h>

#include "engine/engine.h"
#include "golden_util.h"
#include "test_util.h"

using namespace expertd::test;

TEST(Ling, SynthModelsMatchLlamaCpp) {
  for (const char* id : {"ling/ling-f32", "ling/ling-f16", "ling/ling-q4_k"})
    check_synth_case(id, "bailingmoe2");
}

TEST(Ling, DaemonPathIsBitIdenticalToLocal) {
  check_daemon_path_is_local(load_case("ling/ling-q4_k"));
}

// llama.cpp aborts without a gating function; the shared expert's count is required.
TEST(Ling, AMissingKeyIsAnErrorNamingIt) {
  check_missing_keys_are_named(load_case("ling/ling-f32"), {"bailingmoe2.expert_gating_func",
                                                            "bailingmoe2.expert_shared_count"});
}
