#include "engine/archs/common.h"

#include <cmath>

namespace engine::archs {

void read_base(Meta& m, Hparams& hp, int first_moe_layer) {
  m.u("embedding_length", hp.n_embd);
  m.u("block_count", hp.n_layer);
  m.u("attention.head_count", hp.n_head);
  m.u("attention.head_count_kv", hp.n_head_kv, hp.n_head);
  m.u("attention.key_length", hp.head_dim, hp.n_head ? hp.n_embd / hp.n_head : 0);
  m.u("rope.dimension_count", hp.n_rot, hp.head_dim);
  m.u("expert_count", hp.n_expert);
  m.u("expert_used_count", hp.n_expert_used);
  m.u("context_length", hp.n_ctx_train, 4096);
  m.f("attention.layer_norm_rms_epsilon", hp.eps, 1e-6f);
  m.f("rope.freq_base", hp.rope_base, 10000.0f);
  hp.n_ff_exp = m.tensor_dim("blk." + std::to_string(first_moe_layer) + ".ffn_gate_exps.weight", 1);
  if (hp.n_ff_exp == kAnyDim) {  // a core GGUF; Mixtral-style llama keeps the width in feed_forward_length
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
    m.fail("expert_gating_func = " + std::to_string(gating) + " is not supported (1 softmax, 2 sigmoid)");
  r.sigmoid = gating == 2;
  m.u("expert_group_count", r.n_group, 0);
  m.u("expert_group_used_count", r.n_group_used, 0);
  m.f("expert_weights_scale", r.w_scale, 1.0f);
  if (r.w_scale == 0.0f) r.w_scale = 1.0f;  // llama.cpp: 0 means unset
  if (r.n_group > 0 && (hp.n_expert % r.n_group || r.n_group_used <= 0 || r.n_group_used > r.n_group ||
                        hp.n_expert / r.n_group < 2))
    m.fail("inconsistent expert groups");
  return r;
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
    m.fail("rope scaling '" + scaling + "' (factor " + std::to_string(factor) + ") is not supported for " + hp.arch + " yet");
    return std::nullopt;
  }
  int n_orig = 0;
  float beta_fast = 32.0f, beta_slow = 1.0f;
  m.u("rope.scaling.original_context_length", n_orig, hp.n_ctx_train);
  m.f("rope.scaling.yarn_beta_fast", beta_fast, 32.0f);
  m.f("rope.scaling.yarn_beta_slow", beta_slow, 1.0f);
  return kernels::yarn_params(factor, hp.n_rot, hp.rope_base, n_orig, beta_fast, beta_slow);
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

}  // namespace engine::archs
