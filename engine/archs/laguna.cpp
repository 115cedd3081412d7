// Laguna (laguna: poolside's Laguna XS.2, S.2, M.1): grouped-query attention with per-head q/k
// RMSNorms, each layer its own query head count (attention.head_count: an array), NeoX RoPE
// (global layers: YaRN as the file gives it over rope.dimension_count; sliding-window layers,
// where the file has a window, plain RoPE over rope.dimension_count_swa at rope.freq_base_swa);
// the sliding layers the pattern's (one global layer, then sliding ones: llama.cpp's default
// period 4, or the file's array); a softplus gate from the block's input on the attention's
// output before attn_output, one value per head or per element as its tensor is wide; leading
// dense layers, then sigmoid routing with the selection bias, renormalised and scaled as the
// file says, beside a shared expert.
#include <cmath>
#include <optional>
#include <vector>

#include "engine/archs/common.h"
#include "engine/engine.h"

namespace engine {
namespace {

class Laguna final : public Arch {
 public:
  void read_hparams(Meta& m, Hparams& hp) override {
    m.u("leading_dense_block_count", n_dense_lead_);
    archs::read_base(m, hp, n_dense_lead_);
    m.per_layer("attention.head_count", hp.n_layer, heads_);
    if (m.file().get_number_array("laguna.attention.head_count_kv"))
      m.per_layer("attention.head_count_kv", hp.n_layer, kv_heads_);
    else
      kv_heads_.assign(size_t(hp.n_layer), hp.n_head_kv);
    m.u("attention.sliding_window", window_, 0);
    route_ = archs::read_routing(m, hp, /*norm_default=*/false, /*sigmoid_default=*/true);
    yarn_ = archs::read_yarn(m, hp, /*yarn_ok=*/true);
    if (!m.error().empty()) return;
    if (n_dense_lead_ >= hp.n_layer) return m.fail("leading_dense_block_count leaves no MoE layer");
    for (int il = 0; il < hp.n_layer; ++il)
      if (heads_[size_t(il)] <= 0 || kv_heads_[size_t(il)] <= 0 ||
          heads_[size_t(il)] % kv_heads_[size_t(il)])
        return m.fail("attention.head_count[" + std::to_string(il) +
                      "] is not a multiple of its KV head count");
    hp.n_head_kv = kv_heads_[0];
    int n_shared = 1, w = 0;
    m.u("expert_shared_count", n_shared, 1);
    m.u("expert_shared_feed_forward_length", w, 0);
    n_ff_shexp_ =
        m.tensor_dim("blk." + std::to_string(n_dense_lead_) + ".ffn_gate_shexp.weight", 1);
    if (n_ff_shexp_ == kAnyDim)  // a core GGUF: the key, else llama.cpp's fallback
      n_ff_shexp_ = w > 0 ? w : hp.n_ff_exp * n_shared;
    if (n_dense_lead_ > 0)
      n_ff_ = archs::width(m, "blk.0.ffn_gate.weight", 1, "feed_forward_length");
    sliding_.assign(size_t(hp.n_layer), 0);
    n_rot_swa_ = hp.n_rot;
    rope_base_swa_ = hp.rope_base;
    if (window_ > 0) {
      m.u("rope.dimension_count_swa", n_rot_swa_, hp.n_rot);
      m.f("rope.freq_base_swa", rope_base_swa_, hp.rope_base);
      sliding_ = archs::read_swa_pattern(m, hp.n_layer, 4, /*global_first=*/true);
      if (!m.error().empty()) return;
      if (n_rot_swa_ > hp.head_dim || n_rot_swa_ % 2)
        return m.fail("implausible laguna.rope.dimension_count_swa");
    }
    // The gate: one value per head (XS.2, S.2) or per element (M.1), as its tensor is wide.
    const int64_t g = m.tensor_dim("blk.0.attn_gate.weight", 1);
    per_element_gate_ = g != kAnyDim && g == int64_t{heads_[0]} * hp.head_dim;
    if (g != kAnyDim && !per_element_gate_ && g != heads_[0])
      return m.fail("blk.0.attn_gate.weight is " + std::to_string(g) +
                    " wide: neither one gate per head nor one per element");
  }

  void plan(const Hparams& hp, Plan& p) override {
    hp_ = hp;
    const int64_t n_embd = hp.n_embd;
    layers_.resize(size_t(hp.n_layer));
    for (int il = 0; il < hp.n_layer; ++il) {
      Layer& w = layers_[size_t(il)];
      const int64_t n_q = heads(il) * hp.head_dim, n_kv = kv(il) * hp.head_dim;
      p.blk(il);
      p.add(w.attn_norm, "attn_norm.weight", {n_embd}, Role::Norm);
      p.add(w.wq, "attn_q.weight", {n_embd, n_q});
      p.add(w.wk, "attn_k.weight", {n_embd, n_kv});
      p.add(w.wv, "attn_v.weight", {n_embd, n_kv});
      p.add(w.wo, "attn_output.weight", {n_q, n_embd}, Role::AttnOut);
      p.add(w.q_norm, "attn_q_norm.weight", {hp.head_dim}, Role::Norm);
      p.add(w.k_norm, "attn_k_norm.weight", {hp.head_dim}, Role::Norm);
      p.add(w.gate, "attn_gate.weight", {n_embd, per_element_gate_ ? n_q : heads(il)});
      if (il < n_dense_lead_) {
        p.add(w.ffn_norm, "ffn_norm.weight", {n_embd}, Role::Norm);
        archs::plan_ffn(p, w.ffn, hp, n_ff_);
        continue;
      }
      p.add(w.moe.norm, "ffn_norm.weight", {n_embd}, Role::Norm);
      w.moe.route = route_;
      p.moe(w.moe, hp);
      archs::plan_shared_expert(p, w.moe, hp, n_ff_shexp_, /*gated=*/false);
    }
  }

  KvRows kv_rows(const Hparams& hp, int il, int) const override {
    return {kv(il) * hp.head_dim, kv(il) * hp.head_dim};
  }
  const MoeWeights* moe(int il) const override {
    return il < n_dense_lead_ ? nullptr : &layers_[size_t(il)].moe;
  }

  void block(Engine& e, int il, Act x) const override {
    Ops& ops = e.ops();
    const Layer& w = layers_[size_t(il)];
    const Hparams& hp = hp_;
    const bool sliding = sliding_[size_t(il)];
    Act h = ops.rms_norm(x, w.attn_norm, hp.eps);
    Act q = ops.matmul(w.wq, h), k = ops.matmul(w.wk, h), v = ops.matmul(w.wv, h);
    Act gate = ops.matmul(w.gate, h);
    ops.rms_norm(q, w.q_norm, q, hp.eps, hp.head_dim);
    ops.rms_norm(k, w.k_norm, k, hp.eps, hp.head_dim);
    // sliding layers: plain RoPE; global ones: YaRN where the file has it
    const RopeOpts rope = sliding
                              ? RopeOpts{rope_base_swa_, /*neox=*/true}
                              : RopeOpts{hp.rope_base, /*neox=*/true, yarn_ ? &*yarn_ : nullptr};
    const int n_rot = sliding ? n_rot_swa_ : hp.n_rot;
    ops.rope(q, hp.head_dim, 0, n_rot, rope);
    ops.rope(k, hp.head_dim, 0, n_rot, rope);
    AttnOpts a{int(heads(il)), int(kv(il)), hp.head_dim, 1.0f / std::sqrt(float(hp.head_dim))};
    if (sliding) a.window = window_;
    Act att = ops.alloc(x.rows, heads(il) * hp.head_dim);
    ops.attention(il, q, k, v, a, att);
    ops.mul_act(att, gate, Unary::Softplus);  // per head: each gate over its head's values
    ops.add(x, ops.matmul(w.wo, att));
    archs::ffn_half(e, il, x, h, moe(il), w.ffn_norm, w.ffn, hp.eps);
  }

  std::vector<std::string> synth_presets() const override { return {"laguna-s-2.1"}; }
  expertd::Result<SynthModel> synth(const std::string& preset, const SynthDims& d) const override;

 private:
  int64_t heads(int il) const { return heads_[size_t(il)]; }
  int64_t kv(int il) const { return kv_heads_[size_t(il)]; }
  struct Layer {
    Tensor attn_norm, wq, wk, wv, wo, q_norm, k_norm, gate;
    Tensor ffn_norm;  // dense layers
    FfnWeights ffn;
    MoeWeights moe;
  };
  Hparams hp_;
  RouteOpts route_;
  std::optional<kernels::Yarn> yarn_;
  int n_dense_lead_ = 0, window_ = 0, n_rot_swa_ = 0;
  float rope_base_swa_ = 0;
  bool per_element_gate_ = false;
  int64_t n_ff_ = 0, n_ff_shexp_ = 0;
  std::vector<int> heads_, kv_heads_;
  std::vector<char> sliding_;  // per layer: a sliding-window layer
  std::vector<Layer> layers_;
};

// Laguna S.2.1 (llama.cpp's converter and loader name it by its 48 layers: 118B total, 8B
// active), with what poolside publishes for the family (Laguna XS.2's card and llama.cpp's
// laguna.cpp): a global layer then three sliding-window ones of 512 positions, 48 query heads on
// global layers and 64 on sliding ones over 8 KV heads of 128, global layers YaRN-scaled at base
// 500,000 over 64 dimensions and sliding ones plain at 10,000 over 128, 256 routed experts and
// one shared, sigmoid routing with the expert bias, a per-head softplus gate, one dense lead
// layer, a 131,072 context. Not published, chosen so the totals come out (and marked so): n_embd
// 2,560, experts of 1,280, 8 of them routed a token (256 x 3 x 2,560 x 1,280 x 47 = 118B
// routed), a dense layer of 10,240, YaRN factor 32 from 4,096 positions, vocabulary 100,352,
// RMSNorm eps 1e-6. --dims: windows of 8, the sliding layers' heads twice the global ones' where
// the KV heads allow, half of the head rotated on global layers, all of it on sliding ones.
expertd::Result<SynthModel> Laguna::synth(const std::string&, const SynthDims& d) const {
  archs::SynthSizes s{2560, 48, 256, 8, 1280, 48, 8, 128, 100352, 500000.0f, 1e-6f, 64};
  int n_ff = 10240, window = 512, swa_heads = 64;
  EXPERTD_TRY(archs::apply_dims(s, d));
  if (d.given()) {
    n_ff = 2 * s.n_ff_exp, window = 8, s.n_rot = s.head_dim / 2;
    swa_heads = 2 * s.n_head;
  }
  if (d.layers > 0) s.n_layer = std::min<int>(s.n_layer, static_cast<int>(d.layers));
  if (s.n_layer < 2) return expertd::make_error("synth laguna-s-2.1: needs 2 layers");
  auto m = archs::synth_base(s, "laguna");
  if (!m) return m;
  std::vector<int32_t> heads(static_cast<size_t>(s.n_layer));
  for (int il = 0; il < s.n_layer; ++il) heads[size_t(il)] = il % 4 == 0 ? s.n_head : swa_heads;
  m->u32.erase("attention.head_count");
  m->arrays["attention.head_count"] = heads;
  m->u32["context_length"] = 131072;
  m->u32["leading_dense_block_count"] = 1;
  m->u32["feed_forward_length"] = n_ff;
  m->u32["expert_shared_count"] = 1;
  m->u32["expert_shared_feed_forward_length"] = s.n_ff_exp;
  m->u32["expert_gating_func"] = 2;  // sigmoid
  m->flags["expert_weights_norm"] = true;
  m->f32["expert_weights_scale"] = 1.0f;
  m->u32["attention.sliding_window"] = window;
  m->u32["rope.dimension_count_swa"] = s.head_dim;
  m->f32["rope.freq_base_swa"] = 10000.0f;
  m->strings["rope.scaling.type"] = "yarn";
  m->f32["rope.scaling.factor"] = 32.0f;
  m->u32["rope.scaling.original_context_length"] = 4096;
  return m;
}

}  // namespace

std::unique_ptr<Arch> make_arch_laguna() {
  return std::make_unique<Laguna>();
}

}  // namespace engine
