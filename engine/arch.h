// Architectures differ in a few traits, held as data; each lives in its own arch_*.cpp.
#pragma once

#include <string_view>

namespace engine {

enum class QkNorm { None, PerHead, Full };

struct ArchTraits {
  const char* name;          // general.architecture
  bool rope_neox;            // NeoX (i, i+n/2) pairs, else adjacent (2i, 2i+1)
  QkNorm qk_norm;
  bool norm_topk_default;    // when {arch}.expert_weights_norm is absent
  bool qkv_bias;             // attn_{q,k,v}.bias present
  bool shared_expert_gated;  // sigmoid(ffn_gate_inp_shexp . x) * shared expert
  bool mla = false;          // multi-head latent attention (DeepSeek-V2/V3): a latent KV cache
  const char* ffn_norm = "ffn_norm";  // the norm before the FFN (gpt-oss: post_attention_norm)
  bool swiglu_oai = false;            // gpt-oss: min(g, 7) * sigmoid(1.702 min(g, 7)) * (clamp(u, -7, 7) + 1)
  bool topk_then_softmax = false;     // gpt-oss: top-k of the raw logits, weights = softmax over those k
  int swa_period = 0;                 // layers il % swa_period == 0 use the sliding window (0: none)
  bool sigmoid_gating_default = false;  // when {arch}.expert_gating_func is absent (glm4moe: sigmoid)
  bool has_nextn = false;               // the last nextn_predict_layers blocks are MTP heads, not run
};

const ArchTraits* find_arch(std::string_view name);  // nullptr when unsupported
const char* supported_archs();

}  // namespace engine
