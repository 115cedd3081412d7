// DeepSeek-V2/V3's architecture class (deepseek2), which the DSA architectures (DeepSeek-V3.2's
// deepseek32, GLM-5's glm-dsa: engine/archs/deepseek32.cpp) extend with the lightning indexer.
// Its forward pass, metadata and presets are deepseek2.cpp's.
#pragma once

#include <cmath>

#include "engine/archs/common.h"
#include "engine/engine.h"

namespace engine::archs {

class Deepseek2 : public Arch {
 public:
  void read_hparams(Meta& m, Hparams& hp) override;

  void plan(const Hparams& hp, Plan& p) override;

  // One latent row per position (kv_lora + n_rot floats) serves as keys and, its first kv_lora
  // floats, as values.
  KvRows kv_rows(const Hparams& hp, int, int) const override { return {kv_lora_ + hp.n_rot, 0}; }
  const MoeWeights* moe(int il) const override {
    return il < n_dense_lead_ ? nullptr : &layers_[il].moe;
  }

  void block(Engine& e, int il, Act x) const override;

  std::vector<std::string> synth_presets() const override {
    return {"deepseek-v2-lite", "mistral-large-3", "glm-4.7-flash"};
  }
  // DeepSeek-V2-Lite: its published config.json. Mistral Large 3 (675B, 41B active, a 262,144
  // context: Mistral's announcement as vercel.com/ai-gateway/models/mistral-large-3 gives it),
  // written by llama.cpp's converter (conversion/mistral.py) as deepseek2 with softmax routing
  // renormalised, YaRN with yarn_log_multiplier 0.1 and original context 8,192 (also the
  // temperature length), the Llama 4 query temperature (beta 0.1) and the tekken vocabulary of
  // 131,072. Its MLA and layer sizes are DeepSeek-V3's (n_embd 7,168, 61 layers, 128 heads,
  // q/kv LoRA 1,536/512, nope/rope/v 128/64/128, 3 dense lead layers of 18,432, one shared
  // expert), the lineage it keeps; 128 routed experts of 4,096, top-4, are derived: they give
  // the published totals (128 x 3 x 7,168 x 4,096 x 58 = 653B routed; 4 of them, the shared
  // expert, attention and the dense layers = 41B).
  expertd::Result<SynthModel> synth(const std::string& preset, const SynthDims& d) const override;

 protected:
  expertd::Result<SynthModel> synth_glm_lite(const SynthDims& d) const;
  // llama.cpp's deepseek2 loader: a file without expert_gating_func gates by sigmoid where it is
  // GLM-4.7-Flash's (47 or 48 trunk layers of its 154,880-token vocabulary), else by softmax.
  static bool glm_lite_shape(int n_layer, int64_t n_vocab) {
    return (n_layer == 47 || n_layer == 48) && n_vocab == 154880;
  }
  // The GLM-4.x/GLM-5 chat tokens synth writes (and <|endoftext|>, which every synth has).
  static std::vector<std::string> glm_specials() {
    return {"[gMASK]",         "<sop>",      "<|system|>",  "<|user|>",    "<|assistant|>",
            "<|observation|>", "<think>",    "</think>",    "<tool_call>", "</tool_call>",
            "<arg_key>",       "</arg_key>", "<arg_value>", "</arg_value>"};
  }
  // The attention output (after attn_output) of layer il for the projections qkv (rotated here),
  // over the selected positions only where `sel` is given (Ops::attention_mla).
  Act attend(Ops& ops, int il, const MlaQkv& qkv, Act sel) const;
  // The FFN half of layer il: x += its dense FFN or MoE of rmsnorm(x) (h: scratch of x's shape).
  void ffn_part(Engine& e, int il, Act x, Act h) const;
  struct Layer {
    Tensor attn_norm, wk_b, wv_b, wo;
    MlaProjections mla;
    Tensor ffn_norm;  // dense layers
    FfnWeights ffn;
    MoeWeights moe;
  };
  // what the subclasses change; glm_lite_default_: llama.cpp's GLM-4.7-Flash gating rule
  // (deepseek2's loader only)
  bool sigmoid_default_ = false, yarn_ok_ = true, glm_lite_default_ = true;
  Hparams hp_;
  RouteOpts route_;
  int n_dense_lead_ = 0, q_lora_ = 0, kv_lora_ = 0, k_mla_ = 0, v_mla_ = 0;
  int64_t n_ff_ = 0, n_ff_shexp_ = 0;
  float mscale_ = 1.0f;  // YaRN: the attention scale is mscale^2 / sqrt(k_mla)
  AttnTemp temp_;        // the query temperature, where the file has one
  std::optional<kernels::Yarn> yarn_;
  std::vector<Layer> layers_;
};

}  // namespace engine::archs
