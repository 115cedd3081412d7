// Llama 4 (llama4) against llama.cpp: test-size synthetic models (tests/data/llama4: the
// expert-pack synth recipe and llama.cpp's teacher-forced logits, made by
// scripts/gen-llama4-cases.py with llama-cpp-python 0.3.36) in F32, F16 and Q4_K_M's mix: MoE
// every second layer with one expert a token whose router weight scales its input, a shared
// expert, the unrotated fourth layer, the per-head QK norm of the models below 128 experts. The
// daemon path; the chunk; the keys.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "engine/cpu_ops.h"
#include "engine/engine.h"
#include "golden_util.h"
#include "test_util.h"

using namespace expertd::test;

TEST(Llama4, SynthModelsMatchLlamaCpp) {
  for (const char* id : {"llama4/l4-f32", "llama4/l4-f16", "llama4/l4-q4_k", "llama4/l4-k2-f32"})
    check_synth_case(id, "llama4");
}

// Two experts a token (llama.cpp runs any count; the published models route one): each route's
// input scaled by its own weight, through expertd as locally.
TEST(Llama4, TwoExpertsATokenThroughTheDaemonAsLocally) {
  check_daemon_path_is_local(load_case("llama4/l4-k2-f32"));
}

TEST(Llama4, DaemonPathIsBitIdenticalToLocal) {
  check_daemon_path_is_local(load_case("llama4/l4-q4_k"));
}

TEST(Llama4, AMissingKeyIsAnErrorNamingIt) {
  check_missing_keys_are_named(load_case("llama4/l4-f32"), {"llama4.interleave_moe_layer_step"});
}

// Chunked attention (llama.cpp's chunks of 8,192 are past any test prompt): a token sees the keys
// of its own chunk only, against the definition computed here, at chunks of 4 over two
// sequences' positions.
TEST(Llama4, ChunkedAttentionSeesOnlyItsOwnChunk) {
  auto ops = engine::make_cpu_ops(2);
  constexpr int H = 2, HKV = 1, T = 11;
  constexpr int64_t D = 8;
  ops->init_cache({engine::KvRows{HKV * D, HKV * D}}, 32, 1, engine::KvType::F32);
  const engine::SeqRows seq{0, 0, T, 0};
  ops->begin_eval({&seq, 1});
  std::vector<float> q(T * H * D), k(T * D), v(T * D);
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.37f * float(i));
  for (size_t i = 0; i < k.size(); ++i)
    k[i] = std::cos(0.23f * float(i)), v[i] = std::sin(0.11f * float(i) + 1);
  auto up = [&](std::vector<float>& x, int64_t cols) {
    engine::Act a = ops->alloc(T, cols);
    std::memcpy(a.data, x.data(), x.size() * 4);
    return a;
  };
  engine::Act qa = up(q, H * D), ka = up(k, D), va = up(v, D), out = ops->alloc(T, H * D);
  engine::AttnOpts o{H, HKV, D, 0.3f};
  o.chunk = 4;
  ops->attention(0, qa, ka, va, o, out);
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) {
      const int first = t / 4 * 4;
      std::vector<double> s;
      double mx = -1e30, sum = 0;
      for (int j = first; j <= t; ++j) {
        double d = 0;
        for (int i = 0; i < D; ++i) d += double(q[(t * H + h) * D + i]) * k[j * D + i];
        s.push_back(d * 0.3), mx = std::max(mx, s.back());
      }
      for (double& x : s) x = std::exp(x - mx), sum += x;
      for (int i = 0; i < D; ++i) {
        double want = 0;
        for (int j = first; j <= t; ++j) want += s[size_t(j - first)] / sum * v[j * D + i];
        EXPECT_NEAR(out.row(t)[h * D + i], want, 1e-5) << "token " << t << " head " << h;
      }
    }
}

TEST(Llama4, TheRopeFrequencyFactorsAct) {
  check_rope_freqs_act(load_case("llama4/l4-f32"));
}
