// Qwen3.5-MoE (qwen35moe) and Qwen3-Next (qwen3next) against llama.cpp: test-size synthetic
// models (tests/data/qwen35: the expert-pack synth recipe and llama.cpp's teacher-forced logits,
// made by scripts/gen-qwen35-cases.py with llama-cpp-python 0.3.36) in F32, F16, Q4_K_M's mix and
// Q8_0; the delta-net's state across eval calls; the daemon path; the keys they cannot run
// without.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "golden_util.h"
#include "test_util.h"

using namespace expertd::test;

namespace {

// Each case and the architecture its file names.
const std::pair<const char*, const char*> kCases[] = {{"qwen35/q35-f32", "qwen35moe"},
                                                      {"qwen35/q35-f16", "qwen35moe"},
                                                      {"qwen35/q35-q4_k", "qwen35moe"},
                                                      {"qwen35/next-f32", "qwen3next"},
                                                      {"qwen35/next-q8_0", "qwen3next"}};

}  // namespace

// F32 within the golden README's F32 rule; the others within its quantized-model limits.
TEST(Qwen35, SynthModelsMatchLlamaCpp) {
  for (const auto& [id, arch] : kCases) check_synth_case(id, arch);
}

// The delta-net layers carry their convolution and recurrent state from one eval to the next.
TEST(Qwen35, ChunkedPrefillEqualsOneBatch) {
  for (const char* id : {"qwen35/q35-f32", "qwen35/next-f32"}) {
    SCOPED_TRACE(id);
    Case c = load_case(id);
    auto l = load(c);
    ASSERT_TRUE(l);
    check_chunked_prefill(l->model, c, {1, 3, 7}, 1e-4);
    check_state_matters(l->model, c);
  }
}

// Through a real expertd: bit-identical to --local, for both architectures.
TEST(Qwen35, DaemonPathIsBitIdenticalToLocal) {
  for (const char* id : {"qwen35/q35-q4_k", "qwen35/next-q8_0"}) {
    SCOPED_TRACE(id);
    check_daemon_path_is_local(load_case(id));
  }
}

// The keys the delta-net and the M-RoPE sections cannot run without are named when missing, and
// a routing llama.cpp would not run is refused rather than run.
TEST(Qwen35, AMissingOrUnsupportedKeyIsAnErrorNamingIt) {
  check_missing_keys_are_named(
      load_case("qwen35/q35-f32"),
      {"qwen35moe.ssm.conv_kernel", "qwen35moe.ssm.group_count", "qwen35moe.ssm.time_step_rank",
       "qwen35moe.rope.dimension_sections"});
}
