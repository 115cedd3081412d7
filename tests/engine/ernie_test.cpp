// ERNIE 4.5 MoE (ernie4_5-moe) against llama.cpp: test-size synthetic models (tests/data/ernie:
// the expert-pack synth recipe and llama.cpp's teacher-forced logits, made by
// scripts/gen-ernie-cases.py with llama-cpp-python 0.3.36) in F32, F16 and Q4_K_M's mix: a dense
// lead layer, softmax routing beside two shared experts. The daemon path; the keys.
#include <gtest/gtest.h>

#include "engine/engine.h"
#include "golden_util.h"
#include "test_util.h"

using namespace expertd::test;

TEST(Ernie45, SynthModelsMatchLlamaCpp) {
  for (const char* id : {"ernie/ernie-f32", "ernie/ernie-f16", "ernie/ernie-q4_k"})
    check_synth_case(id, "ernie4_5-moe");
}

TEST(Ernie45, DaemonPathIsBitIdenticalToLocal) {
  check_daemon_path_is_local(load_case("ernie/ernie-q4_k"));
}

// The MoE layers' step is needed; one llama.cpp cannot run (it plans no dense FFN for the layers
// a step skips) is refused naming the key.
TEST(Ernie45, AMissingOrUnsupportedKeyIsAnErrorNamingIt) {
  Case c = load_case("ernie/ernie-f32");
  check_missing_keys_are_named(c, {"ernie4_5-moe.interleave_moe_layer_step"});
  check_refused_with_u32(c, "ernie4_5-moe.interleave_moe_layer_step", 1, 2);
}
