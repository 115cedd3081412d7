// Hy3 (hy_v3) against llama.cpp: test-size synthetic models (tests/data/hy3: the expert-pack
// synth recipe and llama.cpp's teacher-forced logits, made by scripts/gen-hy3-cases.py with
// llama-cpp-python 0.3.36) in F32, F16 and Q4_K_M's mix: per-head q/k norms, a dense lead layer
// (no router), sigmoid routing with the selection bias named exp_probs_b beside a shared expert,
// the MTP block in the file. The daemon path; the bias bound; the keys.
#include <gtest/gtest.h>

#include "engine/engine.h"
#include "golden_util.h"
#include "test_util.h"

using namespace expertd::test;

TEST(Hy3, SynthModelsMatchLlamaCpp) {
  for (const char* id : {"hy3/hy3-f32", "hy3/hy3-f16", "hy3/hy3-q4_k"})
    check_synth_case(id, "hy_v3");
}

TEST(Hy3, DaemonPathIsBitIdenticalToLocal) {
  check_daemon_path_is_local(load_case("hy3/hy3-q4_k"));
}

// Layer 0 has no router and runs a dense FFN; the MoE layers read their selection bias from
// blk.N.exp_probs_b (Hy3's name, without .bias); the MTP block is not run.
TEST(Hy3, DenseByTheRouterAndTheBiasUnderItsOwnName) {
  auto l = load(load_case("hy3/hy3-f32"));
  ASSERT_TRUE(l);
  const engine::Model& m = l->model;
  EXPECT_EQ(m.hp.n_layer, 4);
  EXPECT_EQ(m.moe(0), nullptr);
  for (int il = 1; il < m.hp.n_layer; ++il) {
    ASSERT_NE(m.moe(il), nullptr) << il;
    ASSERT_TRUE(m.moe(il)->exp_probs_b) << il;
    EXPECT_EQ(m.moe(il)->exp_probs_b.ne[0], m.hp.n_expert);
  }
}

TEST(Hy3, AMissingKeyIsAnErrorNamingIt) {
  check_missing_keys_are_named(load_case("hy3/hy3-f32"),
                               {"hy_v3.block_count", "hy_v3.expert_count"});
}
