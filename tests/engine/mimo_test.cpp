// MiMo-V2 (mimo2) against llama.cpp: test-size synthetic models (tests/data/mimo: the expert-pack
// synth recipe and llama.cpp's teacher-forced logits, made by scripts/gen-mimo-cases.py with
// llama-cpp-python 0.3.36) in F32, F16 and Q4_K_M's mix: keys of the head size and values of
// half, 2 KV heads on global layers and 4 on sliding ones, windows of 8 with sink biases, the
// value scale, a dense first layer, sigmoid routing, 3 MTP blocks in the file. The daemon path;
// chunked prefill; the window acting; the keys. (The Q4_K mix's rows agree with llama.cpp's to
// ~1e-6 up to row 3, then by ~5e-2. The same model with F32 experts agrees on every row and the
// routing's margins there are >= 8e-4, so the likeliest cause, not traced further, is an expert's
// SwiGLU output one ulp apart (our exp is within an ulp of ggml's, not its bits) rounding to
// another Q8_K value before the down projection; Ling's and ERNIE's mixes show it on a few rows.)
#include <gtest/gtest.h>

#include "engine/engine.h"
#include "golden_util.h"
#include "test_util.h"

using namespace expertd::test;

TEST(MimoV2, SynthModelsMatchLlamaCpp) {
  for (const char* id : {"mimo/mimo-f32", "mimo/mimo-f16", "mimo/mimo-q4_k"})
    check_synth_case(id, "mimo2");
}

TEST(MimoV2, ChunkedPrefillEqualsOneBatch) {
  Case c = load_case("mimo/mimo-f32");
  auto l = load(c);
  ASSERT_TRUE(l);
  check_chunked_prefill(l->model, c, {1, 3, 7}, 1e-4);
}

TEST(MimoV2, DaemonPathIsBitIdenticalToLocal) {
  check_daemon_path_is_local(load_case("mimo/mimo-q4_k"));
}

// The window acts: widened past the prompt, the rows of the first 8 positions (inside every
// window) stay bit for bit the same and the later ones change.
TEST(MimoV2, TheSlidingWindowChangesTheLaterRows) {
  Case c = load_case("mimo/mimo-f32");
  TempDir d;
  const std::string model = synth_case(c, d), wide = d / "wide.gguf";
  write_with_u32(model, "mimo2.attention.sliding_window", 8, 256, wide);
  if (HasFatalFailure()) return;
  check_rows_change_from(c, model, wide, 8);
}

// The per-layer KV heads and the values' own head size shape each layer's cache rows.
TEST(MimoV2, EachLayerCachesItsOwnKeyAndValueWidths) {
  auto l = load(load_case("mimo/mimo-f32"));
  ASSERT_TRUE(l);
  const engine::Model& m = l->model;
  ASSERT_EQ(m.hp.n_layer, 7);
  for (int il = 0; il < m.hp.n_layer; ++il) {
    const engine::KvRows r = m.arch->kv_rows(m.hp, il, 64);
    const int64_t heads = il % 6 == 0 ? 2 : 4;  // global, sliding
    EXPECT_EQ(r.k, heads * 32) << il;
    EXPECT_EQ(r.v, heads * 16) << il;
  }
}

TEST(MimoV2, AMissingKeyIsAnErrorNamingIt) {
  check_missing_keys_are_named(
      load_case("mimo/mimo-f32"),
      {"mimo2.attention.sliding_window", "mimo2.attention.sliding_window_pattern",
       "mimo2.attention.head_count_kv"});
}
