// GLM-4.7-Flash (Glm4MoeLiteForCausalLM, which llama.cpp's converter writes as deepseek2 with its
// MTP layer after the trunk and no expert_gating_func): the MTP layer is no trunk layer, and the
// gating the file leaves unwritten is llama.cpp's rule (src/models/deepseek2.cpp): sigmoid at 47
// or 48 trunk layers of the 154,880-token vocabulary, softmax for every other deepseek2 file
// without the key (DeepSeek-V2 and V2.5's). The model against llama.cpp, trunk and NextN drafts:
// tests/data/mtp/glm47flash-f32 (nextn_test.cpp).
#include <gtest/gtest.h>

#include "golden_util.h"

using namespace expertd::test;

namespace {

std::string synth_glm_lite(const TempDir& d, const std::string& name, const std::string& args) {
  const std::string out = d / name;
  auto s =
      run(bin("pack/expert-pack") + " -q synth --preset glm-4.7-flash " + args + " --out " + out);
  EXPECT_EQ(s.first, 0) << s.second;
  return out;
}

struct Routing {
  bool loaded = false, has_key = false, sigmoid = false;
  int n_layer = 0, n_nextn = 0;
};

// How the model at `path` routes (its first MoE layer, 1) and how deep its trunk is; loaded
// with its NextN block where `nextn`.
Routing routing_of(const std::string& path, bool nextn = false) {
  Routing r;
  auto f = gguf::Model::open(path);
  EXPECT_TRUE(f) << (f ? "" : f.error().message);
  if (!f) return r;
  r.has_key = f->get_uint("deepseek2.expert_gating_func").has_value();
  auto m = engine::Model::load(*f, nextn);
  EXPECT_TRUE(m) << (m ? "" : m.error().message);
  if (!m) return r;
  const engine::MoeWeights* moe = m->arch->moe(1);
  EXPECT_NE(moe, nullptr);
  if (!moe) return r;
  r.loaded = true, r.sigmoid = moe->route.sigmoid;
  r.n_layer = m->hp.n_layer, r.n_nextn = m->hp.n_nextn;
  return r;
}

}  // namespace

TEST(GlmLite, GatingWithoutTheKeyIsLlamaCppsRule) {
  TempDir d;
  // The published depth and vocabulary (narrow): no key, as the converter writes it; sigmoid.
  const std::string full = synth_glm_lite(d, "full.gguf", "--dims 64,47,4,2,32,2,1,154880");
  Routing r = routing_of(full, /*nextn=*/true);
  ASSERT_TRUE(r.loaded);
  EXPECT_FALSE(r.has_key);
  EXPECT_TRUE(r.sigmoid);
  EXPECT_EQ(r.n_layer, 47);  // block_count 48: the MTP layer drafts, the trunk is 47
  EXPECT_EQ(r.n_nextn, 1);
  // One trunk layer fewer (block_count 47): the rule no longer holds, softmax.
  const std::string shallow = d / "shallow.gguf";
  write_with_u32(full, "deepseek2.block_count", 48, 47, shallow);
  r = routing_of(shallow);
  ASSERT_TRUE(r.loaded);
  EXPECT_EQ(r.n_layer, 46);
  EXPECT_FALSE(r.sigmoid);
  // Another vocabulary: synth writes sigmoid (2); without the key, softmax.
  const std::string small = synth_glm_lite(d, "small.gguf", "--dims 64,47,4,2,32,2,1,512");
  r = routing_of(small);
  ASSERT_TRUE(r.loaded);
  EXPECT_TRUE(r.has_key);
  EXPECT_TRUE(r.sigmoid);
  const std::string keyless = d / "keyless.gguf";
  ASSERT_TRUE(write_without_key(small, "deepseek2.expert_gating_func", keyless));
  r = routing_of(keyless);
  ASSERT_TRUE(r.loaded);
  EXPECT_FALSE(r.has_key);
  EXPECT_FALSE(r.sigmoid);
}

// A trunk no deeper than its MTP layers is refused, naming the key.
TEST(GlmLite, AnMtpCountLeavingNoTrunkIsRefused) {
  TempDir d;
  const std::string m = synth_glm_lite(d, "m.gguf", "--dims 64,4,4,2,32,2,1,512");
  const std::string bad = d / "bad.gguf";
  write_with_u32(m, "deepseek2.nextn_predict_layers", 1, 5, bad);
  auto f = gguf::Model::open(bad);
  ASSERT_TRUE(f);
  auto l = engine::Model::load(*f);
  ASSERT_FALSE(l);
  EXPECT_NE(l.error().message.find("nextn_predict_layers"), std::string::npos) << l.error().message;
}
