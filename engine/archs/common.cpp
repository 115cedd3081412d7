#include "engine/archs/common.h"

#include <algorithm>
#include <cmath>

namespace engine::archs {

void read_base(Meta& m, Hparams& hp, int first_moe_layer) {
  m.u("embedding_length", hp.n_embd);
  m.u("block_count", hp.n_layer);
  // one count, or one per layer (Laguna's): the largest here, the architecture reads each
  std::vector<int> heads;
  m.per_layer("attention.head_count", hp.n_layer, heads);
  hp.n_head = heads.empty() ? 0 : *std::max_element(heads.begin(), heads.end());
  m.u("attention.head_count_kv", hp.n_head_kv, hp.n_head);
  m.u("attention.key_length", hp.head_dim, hp.n_head ? hp.n_embd / hp.n_head : 0);
  m.u("rope.dimension_count", hp.n_rot, hp.head_dim);
  m.u("expert_count", hp.n_expert);
  m.u("expert_used_count", hp.n_expert_used);
  m.u("context_length", hp.n_ctx_train, 4096);
  m.f("attention.layer_norm_rms_epsilon", hp.eps, 1e-6f);
  m.f("rope.freq_base", hp.rope_base, 10000.0f);
  hp.n_ff_exp = m.tensor_dim("blk." + std::to_string(first_moe_layer) + ".ffn_gate_exps.weight", 1);
  if (hp.n_ff_exp ==
      kAnyDim) {  // a core GGUF; Mixtral-style llama keeps the width in feed_forward_length
    int ff = 0;
    m.u("feed_forward_length", ff, 0);
    m.u("expert_feed_forward_length", ff, ff);
    hp.n_ff_exp = ff;
  }
}

RouteOpts read_routing(Meta& m, const Hparams& hp, bool norm_default, bool sigmoid_default) {
  RouteOpts r;
  m.b("expert_weights_norm", r.norm_topk, norm_default);
  int gating = 0;  // llama.cpp: 1 softmax, 2 sigmoid, 0 unset
  m.u("expert_gating_func", gating, 0);
  if (gating == 0) gating = sigmoid_default ? 2 : 1;
  if (gating != 1 && gating != 2)
    m.fail("expert_gating_func = " + std::to_string(gating) +
           " is not supported (1 softmax, 2 sigmoid)");
  r.sigmoid = gating == 2;
  m.u("expert_group_count", r.n_group, 0);
  m.u("expert_group_used_count", r.n_group_used, 0);
  m.f("expert_weights_scale", r.w_scale, 1.0f);
  if (r.w_scale == 0.0f) r.w_scale = 1.0f;  // llama.cpp: 0 means unset
  if (r.n_group > 0 && (hp.n_expert % r.n_group || r.n_group_used <= 0 ||
                        r.n_group_used > r.n_group || hp.n_expert / r.n_group < 2))
    m.fail("inconsistent expert groups");
  return r;
}

std::vector<char> moe_by_router(Meta& m, int n_layer) {
  const gguf::Model& f = m.file();
  int lead = 0;
  m.u("leading_dense_block_count", lead, 1);
  std::vector<char> moe(size_t(std::max(n_layer, 0)), 0);
  const bool has_tensors = f.tensor("token_embd.weight") != nullptr;
  bool any = false;
  for (int il = 0; il < n_layer; ++il) {
    moe[size_t(il)] =
        has_tensors ? f.tensor("blk." + std::to_string(il) + ".ffn_gate_inp.weight") != nullptr
                    : il >= lead;
    any = any || moe[size_t(il)];
  }
  if (!any) m.fail("no layer has a router (ffn_gate_inp): not an MoE model");
  return moe;
}

std::vector<char> read_swa_pattern(Meta& m, int n_layer, int default_period, bool global_first) {
  std::vector<char> sliding(size_t(std::max(n_layer, 0)), 0);
  const std::string key = m.prefix() + "attention.sliding_window_pattern";
  if (auto a = m.file().get_number_array(key)) {
    if (a->size() < sliding.size())
      m.fail(key + " has " + std::to_string(a->size()) + " values for " + std::to_string(n_layer) +
             " layers");
    else
      for (size_t il = 0; il < sliding.size(); ++il) sliding[il] = (*a)[il] != 0;
    return sliding;
  }
  if (default_period < 0) {
    m.fail("missing metadata " + key);
    return sliding;
  }
  int n = default_period;
  m.u("attention.sliding_window_pattern", n, default_period);
  for (int il = 0; il < n_layer; ++il)
    sliding[size_t(il)] = n == 0 || (global_first ? il % n != 0 : il % n < n - 1);
  return sliding;
}

int read_trunk_by_router(Meta& m, Hparams& hp, std::vector<char>& moe, int* first_moe) {
  int n_all = 0, nextn = 0;
  m.u("block_count", n_all);
  m.u("nextn_predict_layers", nextn, 0);
  if (!m.error().empty()) return 0;
  if (nextn >= n_all) {
    m.fail("nextn_predict_layers leaves no layer to run");
    return 0;
  }
  moe = moe_by_router(m, n_all - nextn);
  if (!m.error().empty()) return 0;
  *first_moe = int(std::find(moe.begin(), moe.end(), 1) - moe.begin());
  read_base(m, hp, *first_moe);
  hp.n_layer = n_all - nextn;
  return m.error().empty() ? n_all : 0;
}

int nextn_blocks(Meta& m, int n_layer, int n_all, const std::string& per_block) {
  if (n_all <= n_layer ||
      m.tensor_dim("blk." + std::to_string(n_layer) + ".nextn.eh_proj.weight", 0) == kAnyDim)
    return 0;
  if (!per_block.empty())
    if (auto a = m.file().get_number_array(m.prefix() + per_block); a && a->size() < size_t(n_all))
      return 0;
  return n_all - n_layer;
}

Act nextn_prenorm_head(Engine& e, const Model& m, const NextnWeights& w, Act x, Act* next_hidden) {
  if (next_hidden) *next_hidden = x;
  return e.ops().rms_norm(x, head_norm(m, w), m.hp.eps);
}

std::vector<float> per_layer_floats(Meta& m, const std::string& key, int n) {
  std::vector<float> v(size_t(std::max(n, 0)), 0.0f);
  if (auto x = m.file().get_number_array(m.prefix() + key))
    for (size_t il = 0; il < v.size() && il < x->size(); ++il) v[il] = float((*x)[il]);
  return v;
}

int64_t width(Meta& m, const std::string& tensor, int d, const std::string& key) {
  int64_t w = m.tensor_dim(tensor, d);
  if (w != kAnyDim) return w;
  int v = 0;
  m.u(key, v);
  return v;
}

std::optional<kernels::Yarn> read_yarn(Meta& m, const Hparams& hp, bool yarn_ok) {
  const std::string scaling = m.s("rope.scaling.type", "none");
  float factor = 1.0f;
  m.f("rope.scaling.factor", factor, 1.0f);
  if (factor == 1.0f || scaling == "none") return std::nullopt;
  if (scaling != "yarn" || !yarn_ok) {
    m.fail("rope scaling '" + scaling + "' (factor " + std::to_string(factor) +
           ") is not supported for " + hp.arch + " yet");
    return std::nullopt;
  }
  int n_orig = 0;
  float beta_fast = 32.0f, beta_slow = 1.0f;
  m.u("rope.scaling.original_context_length", n_orig, hp.n_ctx_train);
  m.f("rope.scaling.yarn_beta_fast", beta_fast, 32.0f);
  m.f("rope.scaling.yarn_beta_slow", beta_slow, 1.0f);
  return kernels::yarn_params(factor, hp.n_rot, hp.rope_base, n_orig, beta_fast, beta_slow);
}

void plan_mla(Plan& p, MlaProjections& w, int64_t n_embd, int64_t q_lora, int64_t n_q,
              int64_t kv_lora, int64_t n_rot) {
  if (q_lora > 0) {
    p.add(w.wq_a, "attn_q_a.weight", {n_embd, q_lora});
    p.add(w.q_a_norm, "attn_q_a_norm.weight", {q_lora}, Role::Norm);
    p.add(w.wq_b, "attn_q_b.weight", {q_lora, n_q});
  } else {
    p.add(w.wq, "attn_q.weight", {n_embd, n_q});
  }
  p.add(w.wkv_a, "attn_kv_a_mqa.weight", {n_embd, kv_lora + n_rot});
  p.add(w.kv_a_norm, "attn_kv_a_norm.weight", {kv_lora}, Role::Norm);
}

MlaQkv mla_project(Ops& ops, const MlaProjections& w, Act h, int64_t kv_lora, float eps) {
  MlaQkv r;
  if (w.wq_a) {
    r.qa = ops.matmul(w.wq_a, h);
    ops.rms_norm(r.qa, w.q_a_norm, r.qa, eps);
    r.q = ops.matmul(w.wq_b, r.qa);
  } else {
    r.q = ops.matmul(w.wq, h);
  }
  r.kv = ops.matmul(w.wkv_a, h);
  ops.rms_norm(columns(r.kv, 0, kv_lora), w.kv_a_norm, columns(r.kv, 0, kv_lora), eps);
  return r;
}

void plan_shared_expert(Plan& p, MoeWeights& w, const Hparams& hp, int64_t n_ff_shexp, bool gated) {
  p.add(w.gate_shexp, "ffn_gate_shexp.weight", {hp.n_embd, n_ff_shexp});
  p.add(w.up_shexp, "ffn_up_shexp.weight", {hp.n_embd, n_ff_shexp});
  p.add(w.down_shexp, "ffn_down_shexp.weight", {n_ff_shexp, hp.n_embd});
  if (gated) p.add(w.shexp_gate, "ffn_gate_inp_shexp.weight", {hp.n_embd}, Role::Bias);
}

void plan_ffn(Plan& p, FfnWeights& w, const Hparams& hp, int64_t n_ff) {
  p.add(w.gate, "ffn_gate.weight", {hp.n_embd, n_ff});
  p.add(w.up, "ffn_up.weight", {hp.n_embd, n_ff});
  p.add(w.down, "ffn_down.weight", {n_ff, hp.n_embd});
}

void plan_gqa(Plan& p, GqaWeights& w, const Hparams& hp) {
  const int64_t n_q = q_width(hp), n_kv = kv_width(hp);
  p.add(w.attn_norm, "attn_norm.weight", {hp.n_embd}, Role::Norm);
  p.add(w.wq, "attn_q.weight", {hp.n_embd, n_q});
  p.add(w.wk, "attn_k.weight", {hp.n_embd, n_kv});
  p.add(w.wv, "attn_v.weight", {hp.n_embd, n_kv});
  p.add(w.wo, "attn_output.weight", {n_q, hp.n_embd}, Role::AttnOut);
}

Act ffn_out(Engine& e, int il, Act x, Act h, const MoeWeights* moe, const Tensor& ffn_norm,
            const FfnWeights& ffn, float eps) {
  Ops& ops = e.ops();
  if (!moe) {
    ops.rms_norm(x, ffn_norm, h, eps);
    Act y = ops.alloc(x.rows, x.cols);
    ops.ffn(ffn, h, y);
    return y;
  }
  ops.rms_norm(x, moe->norm, h, eps);
  return e.moe(il, *moe, h);
}

void ffn_half(Engine& e, int il, Act x, Act h, const MoeWeights* moe, const Tensor& ffn_norm,
              const FfnWeights& ffn, float eps) {
  e.ops().add(x, ffn_out(e, il, x, h, moe, ffn_norm, ffn, eps));
}

expertd::Status apply_dims(SynthSizes& s, const SynthDims& d) {
  if (!d.given()) return {};
  const auto& v = d.dims;
  if (v.size() < 5)
    return expertd::make_error(
        "--dims needs at least n_embd,n_layer,n_expert,n_expert_used,n_ff_exp");
  for (uint64_t x : v)
    if (x > (1u << 24)) return expertd::make_error("--dims: implausible size " + std::to_string(x));
  s.n_embd = int(v[0]), s.n_layer = int(v[1]), s.n_expert = int(v[2]), s.n_expert_used = int(v[3]),
  s.n_ff_exp = int(v[4]);
  if (v.size() >= 7) s.n_head = int(v[5]), s.n_head_kv = int(v[6]);
  if (v.size() >= 8) s.n_vocab = int(v[7]);
  if (s.n_head == 0 || s.n_embd % s.n_head)
    return expertd::make_error("--dims: n_embd must be a multiple of n_head");
  s.head_dim = s.n_embd / s.n_head;
  return {};
}

expertd::Result<SynthModel> synth_base(const SynthSizes& s, const std::string& pre) {
  if (s.n_expert_used > s.n_expert || s.n_expert < 2 || s.n_vocab < 300 || s.n_head_kv == 0 ||
      s.n_head % s.n_head_kv || s.n_embd % 32 || s.n_layer < 1 || s.n_ff_exp < 32)
    return expertd::make_error("synth: inconsistent dimensions");
  SynthModel m;
  m.pre = pre, m.n_vocab = s.n_vocab;
  m.u32 = {{"context_length", 4096},
           {"embedding_length", s.n_embd},
           {"block_count", s.n_layer},
           {"feed_forward_length", s.n_ff_exp},
           {"expert_feed_forward_length", s.n_ff_exp},
           {"attention.head_count", s.n_head},
           {"attention.head_count_kv", s.n_head_kv},
           {"attention.key_length", s.head_dim},
           {"attention.value_length", s.head_dim},
           {"rope.dimension_count", s.n_rot ? s.n_rot : s.head_dim},
           {"expert_count", s.n_expert},
           {"expert_used_count", s.n_expert_used}};
  m.f32 = {{"rope.freq_base", s.rope_base}, {"attention.layer_norm_rms_epsilon", s.eps}};
  return m;
}

void synth_mla(SynthModel& m, const SynthMla& a) {
  m.u32["attention.q_lora_rank"] = a.q_lora;
  m.u32["attention.kv_lora_rank"] = a.kv_lora;
  m.u32["attention.key_length"] = a.kv_lora + a.rope;
  m.u32["attention.value_length"] = a.kv_lora;
  m.u32["attention.key_length_mla"] = a.qk_nope + a.rope;
  m.u32["attention.value_length_mla"] = a.v_head;
  m.u32["rope.dimension_count"] = a.rope;
}

}  // namespace engine::archs
