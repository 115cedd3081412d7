#include "engine/synth.h"

#include <cmath>
#include <cstring>

#include "engine/engine.h"
#include "engine/expert_source.h"
#include "gguf/gguf_reader.h"
#include "kernels/kernels.h"
#include "pack/builder.h"
#include "pack/quantize.h"
#include "pack/verify.h"
#include "test_util.h"

using namespace expertd;
using namespace expertd::test;

namespace {

float fp16_to_fp32(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1F, mant = h & 0x3FF;
  float f;
  if (exp == 0)
    f = std::ldexp(static_cast<float>(mant), -24);
  else if (exp == 31)
    f = mant ? NAN : INFINITY;
  else
    f = std::ldexp(static_cast<float>(mant | 0x400), static_cast<int>(exp) - 25);
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits |= sign;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Reference dequantizers written from GGML's block layouts (ggml-common.h).
std::vector<float> dequant_q8_0(const uint8_t* p, size_t n) {
  std::vector<float> out(n);
  for (size_t b = 0; b < n / 32; ++b, p += 34) {
    uint16_t d;
    std::memcpy(&d, p, 2);
    for (int i = 0; i < 32; ++i) out[b * 32 + i] = fp16_to_fp32(d) * static_cast<int8_t>(p[2 + i]);
  }
  return out;
}

std::vector<float> dequant_q4_k(const uint8_t* p, size_t n) {
  std::vector<float> out(n);
  for (size_t b = 0; b < n / 256; ++b, p += 144) {
    uint16_t hd, hm;
    std::memcpy(&hd, p, 2);
    std::memcpy(&hm, p + 2, 2);
    float d = fp16_to_fp32(hd), dmin = fp16_to_fp32(hm);
    const uint8_t* q = p + 4;
    const uint8_t* qs = p + 16;
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      if (j < 4)
        sc = q[j] & 63, m = q[j + 4] & 63;
      else
        sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
      for (int l = 0; l < 32; ++l) {
        int idx = j * 32 + l;
        uint8_t byte = qs[(idx / 64) * 32 + l];
        int nib = (j % 2 == 0) ? (byte & 0xF) : (byte >> 4);
        out[b * 256 + idx] = d * sc * nib - dmin * m;
      }
    }
  }
  return out;
}

}  // namespace

TEST(Quantize, RoundTripsWithinTheTypesPrecision) {
  uint64_t rng = 42;
  std::vector<float> x(512);
  for (auto& v : x) v = pack::gauss(rng);
  std::vector<uint8_t> q8(512 / 32 * 34), q4(512 / 256 * 144);
  pack::quantize_row(gguf::GgmlType::Q8_0, x, q8.data());
  pack::quantize_row(gguf::GgmlType::Q4_K, x, q4.data());
  auto y8 = dequant_q8_0(q8.data(), 512), y4 = dequant_q4_k(q4.data(), 512);
  double e8 = 0, e4 = 0, s = 0;
  for (size_t i = 0; i < x.size(); ++i)
    e8 += std::pow(x[i] - y8[i], 2), e4 += std::pow(x[i] - y4[i], 2), s += x[i] * x[i];
  EXPECT_LT(e8 / s, 1e-4);  // 8-bit: NMSE ~ 1e-5
  EXPECT_LT(e4 / s, 2e-2);  // 4-bit with 6-bit scales: NMSE ~ 1e-2
  EXPECT_EQ(pack::fp32_to_fp16(1.0f), 0x3C00);
  EXPECT_EQ(pack::fp32_to_fp16(-2.5f), 0xC100);
  EXPECT_FLOAT_EQ(fp16_to_fp32(pack::fp32_to_fp16(0.1f)), 0.0999755859375f);
}

// How often each of 16 experts is among the top 4 of layer 0's router, over the (normalised)
// Q4_K embeddings of the first n_tokens tokens of a 256-wide model.
std::vector<int> layer0_picks(const gguf::Model& m, int n_tokens) {
  const auto* r = m.tensor("blk.0.ffn_gate_inp.weight");
  EXPECT_EQ(r->type, gguf::GgmlType::F32);
  const auto* emb = m.tensor("token_embd.weight");
  std::vector<int> picks(16, 0);
  for (int tok = 0; tok < n_tokens; ++tok) {
    auto h = dequant_q4_k(emb->data + tok * 144, 256);
    double ss = 0;
    for (float v : h) ss += v * v;
    for (float& v : h) v /= static_cast<float>(std::sqrt(ss / 256));
    std::vector<std::pair<float, int>> logits;
    for (int e = 0; e < 16; ++e) {
      const float* row = reinterpret_cast<const float*>(r->data) + e * 256;
      float z = 0;
      for (int i = 0; i < 256; ++i) z += row[i] * h[i];
      logits.push_back({z, e});
    }
    std::sort(logits.rbegin(), logits.rend());
    for (int k = 0; k < 4; ++k) ++picks[logits[k].second];
  }
  return picks;
}

TEST(Synth, WritesALoadableSkewedMoeModelThatPacks) {
  TempDir d;
  engine::SynthOptions o;
  o.dims = {256, 3, 16, 4, 256, 4, 2, 1024};
  o.type = gguf::GgmlType::Q4_K;
  o.out_path = d / "synth.gguf";
  o.progress = false;
  auto bytes = engine::write_synth(o);
  ASSERT_TRUE(bytes) << bytes.error().message;
  auto m = gguf::Model::open(o.out_path);
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ(m->arch(), "qwen3moe");
  EXPECT_EQ(m->get_uint("qwen3moe.expert_count"), 16u);
  EXPECT_EQ(m->get_string_array("tokenizer.ggml.tokens")->size(), 1024u);
  const auto* up = m->tensor("blk.2.ffn_up_exps.weight");
  ASSERT_NE(up, nullptr);
  EXPECT_EQ(up->type, gguf::GgmlType::Q4_K);
  EXPECT_EQ(up->ne[2], 16u);
  // Every weight dequantizes to finite values of sane size.
  auto w = dequant_q4_k(up->data, up->n_elements);
  double ss = 0;
  for (float v : w) {
    ASSERT_TRUE(std::isfinite(v));
    ss += v * v;
  }
  double std_dev = std::sqrt(ss / w.size());
  EXPECT_GT(std_dev, 0.2 / 16);
  EXPECT_LT(std_dev, 5.0 / 16);
  // Routing is skewed but not degenerate: route the (normalised) token embeddings through the
  // layer-0 router; the most popular expert is picked far more often than average, yet most
  // experts are used.
  const int n_tokens = 400;
  std::vector<int> picks = layer0_picks(*m, n_tokens);
  int top = *std::max_element(picks.begin(), picks.end());
  int used =
      static_cast<int>(std::count_if(picks.begin(), picks.end(), [](int c) { return c > 0; }));
  EXPECT_GT(top, 2 * n_tokens * 4 / 16) << "no popularity skew";
  EXPECT_LT(top, n_tokens) << "one expert takes every token";
  EXPECT_GE(used, 12) << "routing collapses onto a few experts";
  // It packs and verifies.
  pack::BuildOptions bo;
  bo.model_path = o.out_path;
  bo.progress = false;
  auto rep = pack::build_pack(bo);
  ASSERT_TRUE(rep) << rep.error().message;
  auto v = pack::verify_pack({rep->manifest_path, "", false});
  ASSERT_TRUE(v) << v.error().message;
  EXPECT_EQ(v->experts_checked, 3u * 16);
  // Unknown presets are refused by name.
  o.preset = "gpt-17";
  auto bad = engine::write_synth(o);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("unknown preset"), std::string::npos);
}

// `--type T` for every weight type the kernels run: a model that loads, whose experts dequantize
// to finite values of about the asked-for size, and that generates finite logits; and the
// per-role overrides give the seed's Kimi-K3 mix (Q2_K gate and up, Q3_K down).
TEST(Synth, EveryWeightTypeAndThePerRoleMix) {
  TempDir d;
  int n_types = 0;
  for (uint32_t t = 0; t < 64; ++t) {
    if (!kernels::weight_type_supported(t)) continue;
    SCOPED_TRACE(kernels::type_traits(t)->name);
    ++n_types;
    engine::SynthOptions o;
    o.dims = {256, 2, 8, 2, 256, 4, 2, 512};
    o.type = static_cast<gguf::GgmlType>(t);
    if (t == kernels::Q2_K) o.down_type = gguf::GgmlType::Q3_K;
    o.out_path = d / (std::string(kernels::type_traits(t)->name) + ".gguf");
    o.progress = false;
    auto bytes = engine::write_synth(o);
    ASSERT_TRUE(bytes) << bytes.error().message;
    auto m = gguf::Model::open(o.out_path);
    ASSERT_TRUE(m) << m.error().message;
    const auto* up = m->tensor("blk.1.ffn_up_exps.weight");
    const auto* down = m->tensor("blk.1.ffn_down_exps.weight");
    ASSERT_TRUE(up && down);
    EXPECT_EQ(up->type, t);
    EXPECT_EQ(down->type, t == kernels::Q2_K ? kernels::Q3_K : t);
    std::vector<float> w(up->n_elements);
    kernels::dequantize_row(t, up->data, w.data(), static_cast<int64_t>(w.size()));
    double ss = 0;
    for (float v : w) {
      ASSERT_TRUE(std::isfinite(v));
      ss += double(v) * v;
    }
    const double std_dev = std::sqrt(ss / double(w.size()));
    EXPECT_GT(std_dev, 0.25 / 16);  // asked: 1 / sqrt(256)
    EXPECT_LT(std_dev, 4.0 / 16);
    auto model = engine::Model::load(*m);
    ASSERT_TRUE(model) << model.error().message;
    auto src = engine::make_local_source(*model);
    engine::Engine eng(*model, *src, 1, 64);
    std::vector<float> logits;
    const int32_t toks[] = {5, 17, 300, 42};
    ASSERT_TRUE(eng.eval({toks, 4}, false, logits));
    for (float v : logits) ASSERT_TRUE(std::isfinite(v));
  }
  EXPECT_EQ(n_types, 28);
  engine::SynthOptions bad;
  bad.dims = {256, 2, 8, 2, 256, 4, 2, 512};
  bad.type = gguf::GgmlType::Q8_K;  // activations only
  bad.out_path = d / "bad.gguf";
  bad.progress = false;
  auto r = engine::write_synth(bad);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("Q8_K is not one the kernels run"), std::string::npos)
      << r.error().message;
}

// --routing balanced: no expert favoured for every token (Kimi-K3's flat use), where the default
// Zipf routing of the same model has a popular one (model/README.md: both beside the trained
// model's trace).
TEST(Synth, BalancedRoutingFavoursNoExpert) {
  TempDir d;
  auto picks_of = [&](engine::SynthRouting routing) {
    engine::SynthOptions o;
    o.dims = {256, 2, 16, 4, 256, 4, 2, 1024};
    o.type = gguf::GgmlType::Q4_K;
    o.routing = routing;
    o.out_path = d / "synth.gguf";
    o.progress = false;
    auto bytes = engine::write_synth(o);
    EXPECT_TRUE(bytes) << bytes.error().message;
    auto m = gguf::Model::open(o.out_path);
    return layer0_picks(*m, 800);
  };
  const auto zipf = picks_of(engine::SynthRouting::Zipf);
  const auto flat = picks_of(engine::SynthRouting::Balanced);
  const int mean = 800 * 4 / 16;
  const int top_zipf = *std::max_element(zipf.begin(), zipf.end());
  const int top_flat = *std::max_element(flat.begin(), flat.end());
  const int low_flat = *std::min_element(flat.begin(), flat.end());
  EXPECT_GT(top_zipf, 2 * mean);
  EXPECT_LT(top_flat, 3 * mean / 2) << "balanced routing still favours an expert";
  EXPECT_GT(low_flat, mean / 2) << "balanced routing starves an expert";
}

// The presets of models with a multi-token-prediction layer (DeepSeek-V3.2, GLM-5, Qwen3.5,
// Qwen3-Next, Hy3) write it at test size too, after the trunk, as llama.cpp's converters do: a
// block like a trunk one (Qwen3.5's: full attention, whatever the trunk's last layer is) plus its
// nextn tensors; the engine runs the trunk (and the block, where it drafts with it) and
// expert-pack packs the trunk's experts and the block's.
TEST(Synth, PresetsWithAnMtpLayerWriteIt) {
  const std::pair<const char*, const char*> kPresets[] = {{"deepseek-v3.2", "attn_kv_a_mqa"},
                                                          {"glm-5", "attn_kv_a_mqa"},
                                                          {"qwen3.5-397b-a17b", "attn_q"},
                                                          {"qwen3-next-80b-a3b", "attn_q"},
                                                          {"hy3", "attn_q"}};
  for (const auto& [preset, attn] : kPresets) {
    SCOPED_TRACE(preset);
    TempDir d;
    engine::SynthOptions o;
    o.preset = preset;
    o.dims = {128, 5, 8, 2, 64, 2, 1, 512};
    o.type = gguf::GgmlType::Q8_0;
    o.out_path = d / "m.gguf";
    o.progress = false;
    auto bytes = engine::write_synth(o);
    ASSERT_TRUE(bytes) << bytes.error().message;
    auto m = gguf::Model::open(o.out_path);
    ASSERT_TRUE(m) << m.error().message;
    const std::string a = m->arch();
    EXPECT_EQ(m->get_uint(a + ".nextn_predict_layers"), 1u);
    EXPECT_EQ(m->get_uint(a + ".block_count"), 6u);
    for (const char* t :
         {"nextn.eh_proj.weight", "nextn.enorm.weight", "nextn.hnorm.weight", "ffn_up_exps.weight"})
      EXPECT_NE(m->tensor("blk.5." + std::string(t)), nullptr) << t;
    EXPECT_NE(m->tensor("blk.5." + std::string(attn) + ".weight"), nullptr);
    EXPECT_EQ(m->tensor("blk.6.attn_norm.weight"), nullptr);
    auto model = engine::Model::load(*m);
    ASSERT_TRUE(model) << model.error().message;
    EXPECT_EQ(model->hp.n_layer, 5);
    auto layout = pack::plan_layout(*m);
    ASSERT_TRUE(layout) << layout.error().message;
    const auto moe = layout->moe_layers();
    ASSERT_FALSE(moe.empty());
    EXPECT_EQ(moe.back(), 5u);  // the MTP block's experts are packed (NextN drafting reads them)
  }
}
