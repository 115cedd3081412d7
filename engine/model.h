// The whole model in one header: hyper-parameters read from GGUF metadata, and every weight
// with its shape. ne[0] is a row's length (inputs); a weight computes y = W x with
// W of ne = {in, out}. Weights are views into the memory-mapped GGUF (never copied).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "common/result.h"
#include "engine/arch.h"
#include "gguf/gguf_reader.h"
#include "kernels/kernels.h"

namespace engine {

struct Tensor {
  uint32_t type = 0;                   // GGML type id
  std::array<int64_t, 3> ne{0, 0, 0};  // {in, out, n_expert}
  const uint8_t* data = nullptr;
  explicit operator bool() const { return data != nullptr; }
  const float* f32() const { return reinterpret_cast<const float*>(data); }
};

struct Hparams {
  std::string arch;
  int n_vocab = 0, n_embd = 0, n_layer = 0, n_ctx_train = 0;
  int n_head = 0, n_head_kv = 0, head_dim = 0, n_rot = 0;
  int n_expert = 0, n_expert_used = 0, n_ff_exp = 0, n_ff_shexp = 0;
  float eps = 1e-6f, rope_base = 10000.f;
  bool norm_topk = true;  // renormalise the selected experts' weights
  // Routing variants: sigmoid instead of softmax gating, expert groups (keep the n_group_used
  // groups whose two best selection scores sum highest), routed weights scaled by w_scale.
  bool gating_sigmoid = false;
  int n_group = 0, n_group_used = 0;
  float w_scale = 1.0f;
  // Multi-head latent attention: query and key/value low-rank projections; per head, keys of
  // k_mla = qk_nope + n_rot dims and values of v_mla dims; the cache holds kv_lora + n_rot floats.
  int q_lora = 0, kv_lora = 0, k_mla = 0, v_mla = 0;
  float mla_mscale = 1.0f;     // YaRN: the attention scale is mla_mscale^2 / sqrt(k_mla)
  int swa = 0;                 // sliding window (positions) of the layers the arch's swa_period picks
  bool yarn = false;           // YaRN RoPE with yarn_params
  kernels::Yarn yarn_params;
};

struct LayerWeights {
  Tensor attn_norm;                 // (n_embd)
  Tensor wq, wk, wv;                // (n_embd) -> (n_head * head_dim), (n_head_kv * head_dim)
  Tensor bq, bk, bv;                // optional biases (qwen2moe)
  Tensor q_norm, k_norm;            // (head_dim) per head, or the whole projection (olmoe)
  Tensor wo;                        // (n_head * head_dim) -> (n_embd); MLA: (n_head * v_mla) -> (n_embd)
  Tensor wq_a, q_a_norm, wq_b;      // MLA: (n_embd) -> (q_lora), norm, (q_lora) -> (n_head * k_mla)
  Tensor wkv_a, kv_a_norm;          // MLA: (n_embd) -> (kv_lora + n_rot), norm of the kv_lora part
  Tensor wk_b, wv_b;                // MLA per head: (qk_nope) -> (kv_lora), (kv_lora) -> (v_mla)
  Tensor exp_probs_b;               // selection bias added to the gate scores (F32, n_expert)
  Tensor bo, sinks, router_b;       // attn_output.bias, attn_sinks (one logit per head), ffn_gate_inp.bias
  Tensor gate_exps_b, up_exps_b;    // per-expert biases (F32): (n_ff_exp) x n_expert
  Tensor down_exps_b;               // (n_embd) x n_expert
  Tensor ffn_norm;                  // (n_embd)
  Tensor router;                    // ffn_gate_inp: (n_embd) -> (n_expert), F32
  Tensor gate_exps, up_exps;        // (n_embd) -> (n_ff_exp) x n_expert; absent in a core GGUF
  Tensor down_exps;                 // (n_ff_exp) -> (n_embd) x n_expert
  Tensor shexp_gate;                // ffn_gate_inp_shexp: (n_embd) -> 1, sigmoid gate
  Tensor gate_shexp, up_shexp;      // (n_embd) -> (n_ff_shexp)
  Tensor down_shexp;                // (n_ff_shexp) -> (n_embd)
  Tensor ffn_gate, ffn_up, ffn_down;  // a dense FFN layer (no experts)
  bool is_moe() const { return static_cast<bool>(router); }
};

struct Model {
  Hparams hp;
  const ArchTraits* arch = nullptr;
  Tensor tok_embd;     // (n_embd) x n_vocab
  Tensor output_norm;  // (n_embd)
  Tensor output;       // (n_embd) -> (n_vocab); token_embd when tied
  std::vector<LayerWeights> layers;
  bool has_local_experts = false;  // false for a core GGUF: experts come from expertd
  std::string pack_model_id;       // expertpack.model_id of a core GGUF
  const gguf::Model* file = nullptr;

  // Checks every tensor's presence, type and shape; errors name the tensor and the file.
  static expertd::Result<Model> load(const gguf::Model& file);
};

}  // namespace engine
