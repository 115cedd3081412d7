#include "engine/model.h"

#include <cmath>

#include "kernels/kernels.h"

namespace engine {

using expertd::make_error;
using expertd::Result;

namespace {

class Loader {
 public:
  explicit Loader(const gguf::Model& f) : f_(f) {}
  std::string err;

  // A tensor of the given shape ({in, out[, n]}); missing and optional yields an empty Tensor.
  Tensor get(const std::string& name, std::vector<int64_t> shape, bool required = true, bool f32_only = false) {
    Tensor t;
    if (!err.empty()) return t;
    const gguf::TensorInfo* ti = f_.tensor(name);
    if (!ti) {
      if (required) err = f_.path() + ": missing tensor " + name;
      return t;
    }
    uint32_t type = static_cast<uint32_t>(ti->type);
    if (!kernels::weight_type_supported(type) || (f32_only && type != kernels::F32)) {
      const auto* tr = gguf::type_traits(type);
      err = f_.path() + ": tensor " + name + " has type " + std::string(tr ? tr->name : "?") +
            (f32_only ? ", expected F32" : ", which the engine does not support (F32, F16, BF16, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K)");
      return t;
    }
    for (size_t d = 0; d < 3; ++d) {
      int64_t want = d < shape.size() ? shape[d] : 1;
      if (static_cast<int64_t>(ti->ne[d]) != want) {
        err = f_.path() + ": tensor " + name + " has shape [" + std::to_string(ti->ne[0]) + ", " +
              std::to_string(ti->ne[1]) + ", " + std::to_string(ti->ne[2]) + "], expected [" +
              std::to_string(shape[0]) + (shape.size() > 1 ? ", " + std::to_string(shape[1]) : "") +
              (shape.size() > 2 ? ", " + std::to_string(shape[2]) : "") + "]";
        return t;
      }
    }
    if (ti->n_dims > 3) {
      err = f_.path() + ": tensor " + name + " has " + std::to_string(ti->n_dims) + " dimensions";
      return t;
    }
    t.type = type;
    t.ne = {static_cast<int64_t>(ti->ne[0]), static_cast<int64_t>(ti->ne[1]), static_cast<int64_t>(ti->ne[2])};
    t.data = ti->data;
    return t;
  }

  int u(const std::string& key, int fallback = -1) {
    auto v = f_.get_uint(key);
    if (!v) {
      if (fallback < 0 && err.empty()) err = f_.path() + ": missing metadata " + key;
      return fallback < 0 ? 0 : fallback;
    }
    if (*v > (1u << 30)) {
      if (err.empty()) err = f_.path() + ": implausible " + key + " = " + std::to_string(*v);
      return 0;
    }
    return static_cast<int>(*v);
  }

 private:
  const gguf::Model& f_;
};

}  // namespace

Result<Model> Model::load(const gguf::Model& f) {
  Model m;
  m.file = &f;
  Hparams& hp = m.hp;
  hp.arch = f.arch();
  m.arch = find_arch(hp.arch);
  if (!m.arch)
    return make_error(f.path() + ": architecture '" + hp.arch + "' is not supported (supported: " +
                      supported_archs() + ")");
  Loader L(f);
  const std::string a = hp.arch + ".";
  hp.n_embd = L.u(a + "embedding_length");
  hp.n_layer = L.u(a + "block_count");
  if (m.arch->has_nextn) {  // trailing multi-token-prediction blocks: kept in the file, never run
    const int nextn = static_cast<int>(f.get_uint(a + "nextn_predict_layers").value_or(0));
    if (nextn >= hp.n_layer) return make_error(f.path() + ": nextn_predict_layers leaves no layer to run");
    hp.n_layer -= nextn;
  }
  hp.n_head = L.u(a + "attention.head_count");
  hp.n_head_kv = L.u(a + "attention.head_count_kv", hp.n_head);
  hp.head_dim = L.u(a + "attention.key_length", hp.n_head ? hp.n_embd / hp.n_head : 0);
  hp.n_rot = L.u(a + "rope.dimension_count", hp.head_dim);
  hp.n_expert = L.u(a + "expert_count");
  hp.n_expert_used = L.u(a + "expert_used_count");
  hp.n_ctx_train = L.u(a + "context_length", 4096);
  hp.eps = static_cast<float>(f.get_float(a + "attention.layer_norm_rms_epsilon").value_or(1e-6));
  hp.rope_base = static_cast<float>(f.get_float(a + "rope.freq_base").value_or(10000.0));
  hp.norm_topk = f.get_bool(a + "expert_weights_norm").value_or(m.arch->norm_topk_default);
  // llama.cpp: 1 softmax, 2 sigmoid (0 = unset)
  uint64_t gating = f.get_uint(a + "expert_gating_func").value_or(0);
  if (gating == 0) gating = m.arch->sigmoid_gating_default ? 2 : 1;
  if (gating != 1 && gating != 2)
    return make_error(f.path() + ": " + a + "expert_gating_func = " + std::to_string(gating) + " is not supported (1 softmax, 2 sigmoid)");
  hp.gating_sigmoid = gating == 2;
  hp.n_group = static_cast<int>(f.get_uint(a + "expert_group_count").value_or(0));
  hp.n_group_used = static_cast<int>(f.get_uint(a + "expert_group_used_count").value_or(0));
  hp.w_scale = static_cast<float>(f.get_float(a + "expert_weights_scale").value_or(1.0));
  if (hp.w_scale == 0.0f) hp.w_scale = 1.0f;  // llama.cpp: 0 means unset
  // Rope scaling changes the math: YaRN as llama.cpp computes it where the golden data pins its
  // conventions down (gpt-oss); anything else is refused rather than computed differently.
  const std::string scaling(f.get_string(a + "rope.scaling.type").value_or("none"));
  const double factor = f.get_float(a + "rope.scaling.factor").value_or(1.0);
  if (scaling == "yarn" && factor != 1.0 && (hp.arch == "gpt-oss" || m.arch->mla)) {
    hp.yarn = true;
    hp.yarn_params = kernels::yarn_params(static_cast<float>(factor), hp.n_rot, hp.rope_base,
                                          L.u(a + "rope.scaling.original_context_length", hp.n_ctx_train),
                                          static_cast<float>(f.get_float(a + "rope.scaling.yarn_beta_fast").value_or(32.0)),
                                          static_cast<float>(f.get_float(a + "rope.scaling.yarn_beta_slow").value_or(1.0)));
    if (m.arch->mla) {
      // DeepSeek's YaRN: RoPE's cos/sin keep the original attention factor (1), and the attention
      // scale takes mscale^2 with mscale = 1 + yarn_log_multiplier * ln(factor), the GGUF key
      // holding 0.1 * mscale_all_dim (DeepSeek's yarn_get_mscale). Checked against llama.cpp as
      // llama-cpp-python 0.3.36 builds it on a synthetic DeepSeek-V2-Lite with factor 40: same
      // agreement as without scaling. (Newer llama.cpp graphs multiply by another 0.1 and expect
      // the key written differently; a GGUF from such a converter would be off here.)
      const float attn_factor = static_cast<float>(f.get_float(a + "rope.scaling.yarn_attn_factor").value_or(1.0));
      hp.yarn_params.mscale = attn_factor;
      const float log_mul = static_cast<float>(f.get_float(a + "rope.scaling.yarn_log_multiplier").value_or(0.0));
      hp.mla_mscale = attn_factor * (1.0f + log_mul * std::log(static_cast<float>(factor)));
    }
  } else if (scaling != "none" && factor != 1.0) {
    return make_error(f.path() + ": rope scaling '" + scaling + "' (factor " + std::to_string(factor) +
                      ") is not supported for " + hp.arch + " yet");
  }
  if (m.arch->swa_period) hp.swa = L.u(a + "attention.sliding_window");
  if (m.arch->mla) {
    hp.q_lora = L.u(a + "attention.q_lora_rank", 0);
    hp.kv_lora = L.u(a + "attention.kv_lora_rank");
    hp.k_mla = L.u(a + "attention.key_length_mla");
    hp.v_mla = L.u(a + "attention.value_length_mla");
  }
  if (!L.err.empty()) return make_error(L.err);
  if (m.arch->mla && (hp.n_head_kv != 1 || hp.head_dim != hp.kv_lora + hp.n_rot || hp.k_mla <= hp.n_rot || hp.v_mla <= 0))
    return make_error(f.path() + ": inconsistent multi-head latent attention sizes (a GGUF from an older llama.cpp "
                      "with a joint attn_kv_b? re-convert it)");
  if (hp.n_group > 0 && (hp.n_expert % hp.n_group || hp.n_group_used <= 0 || hp.n_group_used > hp.n_group ||
                         hp.n_expert / hp.n_group < 2))
    return make_error(f.path() + ": inconsistent expert groups");
  if (hp.n_head <= 0 || hp.n_head_kv <= 0 || hp.n_head % hp.n_head_kv || hp.head_dim <= 0 || hp.n_rot > hp.head_dim ||
      hp.n_rot % 2 || hp.n_expert <= 0 || hp.n_expert_used <= 0 || hp.n_expert_used > hp.n_expert || hp.n_layer <= 0 ||
      hp.n_embd <= 0)
    return make_error(f.path() + ": inconsistent hyper-parameters (heads, head size, experts or layers)");
  auto tokens = f.get_string_array("tokenizer.ggml.tokens");
  const gguf::TensorInfo* emb = f.tensor("token_embd.weight");
  hp.n_vocab = tokens ? static_cast<int>(tokens->size()) : emb ? static_cast<int>(emb->ne[1]) : 0;

  const int E = hp.n_embd, Q = hp.n_head * hp.head_dim, KV = hp.n_head_kv * hp.head_dim;
  m.tok_embd = L.get("token_embd.weight", {E, hp.n_vocab});
  m.output_norm = L.get("output_norm.weight", {E}, true, true);
  m.output = L.get("output.weight", {E, hp.n_vocab}, false);
  if (!m.output) m.output = m.tok_embd;
  m.pack_model_id = std::string(f.get_string("expertpack.model_id").value_or(""));
  m.has_local_experts = true;
  for (int il = 0; il < hp.n_layer; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    LayerWeights w;
    w.attn_norm = L.get(p + "attn_norm.weight", {E}, true, true);
    if (m.arch->mla) {
      const int HK = hp.n_head * hp.k_mla, nope = hp.k_mla - hp.n_rot;
      if (hp.q_lora > 0) {
        w.wq_a = L.get(p + "attn_q_a.weight", {E, hp.q_lora});
        w.q_a_norm = L.get(p + "attn_q_a_norm.weight", {hp.q_lora}, true, true);
        w.wq_b = L.get(p + "attn_q_b.weight", {hp.q_lora, HK});
      } else {
        w.wq = L.get(p + "attn_q.weight", {E, HK});
      }
      w.wkv_a = L.get(p + "attn_kv_a_mqa.weight", {E, hp.kv_lora + hp.n_rot});
      w.kv_a_norm = L.get(p + "attn_kv_a_norm.weight", {hp.kv_lora}, true, true);
      w.wk_b = L.get(p + "attn_k_b.weight", {nope, hp.kv_lora, hp.n_head});
      w.wv_b = L.get(p + "attn_v_b.weight", {hp.kv_lora, hp.v_mla, hp.n_head});
      w.wo = L.get(p + "attn_output.weight", {hp.n_head * hp.v_mla, E});
    } else {
      w.wq = L.get(p + "attn_q.weight", {E, Q});
      w.wk = L.get(p + "attn_k.weight", {E, KV});
      w.wv = L.get(p + "attn_v.weight", {E, KV});
      w.wo = L.get(p + "attn_output.weight", {Q, E});
      w.bo = L.get(p + "attn_output.bias", {E}, false, true);
      w.sinks = L.get(p + "attn_sinks.weight", {hp.n_head}, false, true);
    }
    if (m.arch->qkv_bias) {
      w.bq = L.get(p + "attn_q.bias", {Q}, true, true);
      w.bk = L.get(p + "attn_k.bias", {KV}, true, true);
      w.bv = L.get(p + "attn_v.bias", {KV}, true, true);
    }
    if (m.arch->qk_norm == QkNorm::PerHead) {
      w.q_norm = L.get(p + "attn_q_norm.weight", {hp.head_dim}, true, true);
      w.k_norm = L.get(p + "attn_k_norm.weight", {hp.head_dim}, true, true);
    } else if (m.arch->qk_norm == QkNorm::None && !m.arch->mla) {  // optional per-head norms (glm4moe)
      w.q_norm = L.get(p + "attn_q_norm.weight", {hp.head_dim}, false, true);
      w.k_norm = L.get(p + "attn_k_norm.weight", {hp.head_dim}, false, true);
    } else if (m.arch->qk_norm == QkNorm::Full) {
      w.q_norm = L.get(p + "attn_q_norm.weight", {Q}, true, true);
      w.k_norm = L.get(p + "attn_k_norm.weight", {KV}, true, true);
    }
    w.ffn_norm = L.get(p + m.arch->ffn_norm + ".weight", {E}, true, true);
    if (f.tensor(p + "ffn_gate_inp.weight")) {
      w.router = L.get(p + "ffn_gate_inp.weight", {E, hp.n_expert}, true, true);
      w.exp_probs_b = L.get(p + "exp_probs_b.bias", {hp.n_expert}, false, true);
      w.router_b = L.get(p + "ffn_gate_inp.bias", {hp.n_expert}, false, true);
      const gguf::TensorInfo* g = f.tensor(p + "ffn_gate_exps.weight");
      if (g) {
        hp.n_ff_exp = static_cast<int>(g->ne[1]);
        w.gate_exps = L.get(p + "ffn_gate_exps.weight", {E, hp.n_ff_exp, hp.n_expert});
        w.up_exps = L.get(p + "ffn_up_exps.weight", {E, hp.n_ff_exp, hp.n_expert});
        w.down_exps = L.get(p + "ffn_down_exps.weight", {hp.n_ff_exp, E, hp.n_expert});
        w.gate_exps_b = L.get(p + "ffn_gate_exps.bias", {hp.n_ff_exp, hp.n_expert}, false, true);
        w.up_exps_b = L.get(p + "ffn_up_exps.bias", {hp.n_ff_exp, hp.n_expert}, false, true);
        w.down_exps_b = L.get(p + "ffn_down_exps.bias", {E, hp.n_expert}, false, true);
      } else {
        m.has_local_experts = false;
      }
      if (const gguf::TensorInfo* s = f.tensor(p + "ffn_gate_shexp.weight")) {
        hp.n_ff_shexp = static_cast<int>(s->ne[1]);
        w.gate_shexp = L.get(p + "ffn_gate_shexp.weight", {E, hp.n_ff_shexp});
        w.up_shexp = L.get(p + "ffn_up_shexp.weight", {E, hp.n_ff_shexp});
        w.down_shexp = L.get(p + "ffn_down_shexp.weight", {hp.n_ff_shexp, E});
        if (m.arch->shared_expert_gated) w.shexp_gate = L.get(p + "ffn_gate_inp_shexp.weight", {E}, true, true);
      }
    } else {
      const gguf::TensorInfo* g = f.tensor(p + "ffn_gate.weight");
      int ff = g ? static_cast<int>(g->ne[1]) : 0;
      w.ffn_gate = L.get(p + "ffn_gate.weight", {E, ff});
      w.ffn_up = L.get(p + "ffn_up.weight", {E, ff});
      w.ffn_down = L.get(p + "ffn_down.weight", {ff, E});
    }
    if (!L.err.empty()) return make_error(L.err);
    m.layers.push_back(w);
  }
  if (!L.err.empty()) return make_error(L.err);
  // A core GGUF has no expert tensors at all; a whole GGUF must have them in every MoE layer.
  bool any_local = false;
  for (const auto& w : m.layers) any_local |= static_cast<bool>(w.gate_exps);
  if (any_local && !m.has_local_experts) return make_error(f.path() + ": some MoE layers lack expert tensors");
  if (!any_local && m.pack_model_id.empty())
    return make_error(f.path() + ": no expert tensors and no expertpack.model_id: not a model, nor a core GGUF");
  if (!any_local) {
    // Mixtral-style llama keeps the expert width in feed_forward_length.
    hp.n_ff_exp = static_cast<int>(f.get_uint(a + "expert_feed_forward_length")
                                       .value_or(f.get_uint(a + "feed_forward_length").value_or(0)));
  }
  return m;
}

}  // namespace engine
