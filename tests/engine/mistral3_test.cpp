// Mistral Large 3 (deepseek2 with Llama 4's query temperature) against llama.cpp: test-size
// synthetic models (tests/data/mistral3: the expert-pack synth recipe and llama.cpp's
// teacher-forced logits, made by scripts/gen-mistral3-cases.py with llama-cpp-python 0.3.36) in
// F32 and Q4_K_M's mix, 40-token prompts over a temperature length of 8; the daemon path; the
// temperature keys never ignored.
#include <gtest/gtest.h>

#include "golden_util.h"

using namespace expertd::test;

// F32 max 1.4e-6; Q4_K_M's mix bit-close (median row 7e-7) until an activation-rounding flip at
// row 33 (max 0.085 after it). The temperature multiplies the absorbed queries, as llama.cpp's
// graph does: multiplied before the absorption, the activation quantization of the Q8_0 k_b
// matmul rounds differently and every row past the first temperature step is off by ~0.1.
TEST(MistralLarge3, SynthModelsMatchLlamaCpp) {
  check_synth_case("mistral3/ml3-f32", "deepseek2");
  check_synth_case("mistral3/ml3-q4_k", "deepseek2");
}

TEST(MistralLarge3, DaemonPathIsBitIdenticalToLocal) {
  check_daemon_path_is_local(load_case("mistral3/ml3-q4_k"));
}

// The temperature changes every row past its first length of positions: without it (the key
// hidden) the model loads and its rows before position 8 are the same, the later ones are not;
// a scale without a length is refused, naming the key.
TEST(MistralLarge3, TheTemperatureKeysAreNeverIgnored) {
  Case c = load_case("mistral3/ml3-f32");
  TempDir d;
  const std::string model = synth_case(c, d);
  const std::string plain = d / "plain.gguf";
  ASSERT_TRUE(write_without_key(model, "deepseek2.attention.temperature_scale", plain));
  const auto with = case_logits_of(c, model), without = case_logits_of(c, plain);
  ASSERT_EQ(with.size(), without.size());
  const size_t V = c.n_vocab;
  double early = 0, late = 0;
  for (size_t i = 0; i < with.size(); ++i)
    (i / V < 8 ? early : late) =
        std::max(i / V < 8 ? early : late, std::fabs(double(with[i]) - without[i]));
  EXPECT_EQ(early, 0.0);
  EXPECT_GT(late, 1e-3);
  const std::string broken = d / "broken.gguf";
  ASSERT_TRUE(write_without_key(model, "deepseek2.attention.temperature_length", broken));
  auto g = gguf::Model::open(broken);
  ASSERT_TRUE(g);
  auto m = engine::Model::load(*g);
  ASSERT_FALSE(m);
  EXPECT_NE(m.error().message.find("temperature_length"), std::string::npos) << m.error().message;
}
