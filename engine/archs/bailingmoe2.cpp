// Ling 2.0 / Ring 2.0 (bailingmoe2: Ling-mini, Ling-flash, Ling-1T): grouped-query attention
// from one fused QKV projection (queries n_embd wide), per-head q/k RMSNorms, partial NeoX RoPE,
// leading dense layers, then routed experts beside shared ones: sigmoid gating with the selection
// bias, expert groups, renormalised and scaled as the file says. Trailing NextN blocks
// (nextn_predict_layers) are skipped, as llama.cpp skips them.
#include <cmath>

#include "engine/archs/common.h"
#include "engine/engine.h"

namespace engine {
namespace {

class BailingMoe2 final : public Arch {
 public:
  void read_hparams(Meta& m, Hparams& hp) override {
    m.u("leading_dense_block_count", n_dense_lead_, 0);
    archs::read_base(m, hp, n_dense_lead_);
    int nextn = 0;
    m.u("nextn_predict_layers", nextn, 0);
    if (m.error().empty() && nextn >= hp.n_layer)
      return m.fail("nextn_predict_layers leaves no layer to run");
    hp.n_layer -= nextn;
    if (n_dense_lead_ >= hp.n_layer) return m.fail("leading_dense_block_count leaves no MoE layer");
    // llama.cpp needs the gating function (it aborts without one)
    if (!m.has("expert_gating_func"))
      return m.fail("missing metadata bailingmoe2.expert_gating_func");
    route_ = archs::read_routing(m, hp, /*norm_default=*/false, /*sigmoid_default=*/true);
    int n_shared = 0;
    m.u("expert_shared_count", n_shared);
    if (!m.error().empty()) return;
    // llama.cpp: (expert_shared_feed_forward_length, else the expert width) times the count
    n_ff_shexp_ =
        m.tensor_dim("blk." + std::to_string(n_dense_lead_) + ".ffn_gate_shexp.weight", 1);
    if (n_ff_shexp_ == kAnyDim) {
      int w = 0;
      m.u("expert_shared_feed_forward_length", w, 0);
      n_ff_shexp_ = int64_t{w ? w : int(hp.n_ff_exp)} * n_shared;
    }
    if (n_dense_lead_ > 0)
      n_ff_ = archs::width(m, "blk.0.ffn_gate.weight", 1, "feed_forward_length");
    archs::read_yarn(m, hp, /*yarn_ok=*/false);
    if (!m.error().empty()) return;
    // llama.cpp's fused projection is n_embd + 2 n_head_kv head_dim wide, its queries the first
    // n_head head_dim of it: they must be n_embd.
    if (archs::q_width(hp) != hp.n_embd)
      return m.fail(
          "attention.head_count x key_length must equal embedding_length (the fused "
          "QKV projection's queries)");
  }

  void plan(const Hparams& hp, Plan& p) override {
    hp_ = hp;
    const int64_t n_embd = hp.n_embd, n_kv = archs::kv_width(hp);
    layers_.resize(size_t(hp.n_layer));
    for (int il = 0; il < hp.n_layer; ++il) {
      Layer& w = layers_[size_t(il)];
      p.blk(il);
      p.add(w.attn_norm, "attn_norm.weight", {n_embd}, Role::Norm);
      p.add(w.wqkv, "attn_qkv.weight", {n_embd, n_embd + 2 * n_kv});
      p.add(w.wo, "attn_output.weight", {n_embd, n_embd}, Role::AttnOut);
      p.add(w.q_norm, "attn_q_norm.weight", {hp.head_dim}, Role::Norm);
      p.add(w.k_norm, "attn_k_norm.weight", {hp.head_dim}, Role::Norm);
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

  KvRows kv_rows(const Hparams& hp, int, int) const override { return archs::gqa_rows(hp); }
  const MoeWeights* moe(int il) const override {
    return il < n_dense_lead_ ? nullptr : &layers_[size_t(il)].moe;
  }

  void block(Engine& e, int il, Act x) const override {
    Ops& ops = e.ops();
    const Layer& w = layers_[size_t(il)];
    const Hparams& hp = hp_;
    const int64_t n_q = hp.n_embd, n_kv = archs::kv_width(hp);
    const RopeOpts rope{hp.rope_base, /*neox=*/true};
    Act h = ops.rms_norm(x, w.attn_norm, hp.eps);
    Act qkv = ops.matmul(w.wqkv, h);  // [q | k | v] per row
    Act q = ops.alloc(x.rows, n_q), k = ops.alloc(x.rows, n_kv), v = ops.alloc(x.rows, n_kv);
    ops.copy(q, columns(qkv, 0, n_q));
    ops.copy(k, columns(qkv, n_q, n_kv));
    ops.copy(v, columns(qkv, n_q + n_kv, n_kv));
    ops.rms_norm(q, w.q_norm, q, hp.eps, hp.head_dim);
    ops.rms_norm(k, w.k_norm, k, hp.eps, hp.head_dim);
    ops.rope(q, hp.head_dim, 0, hp.n_rot, rope);  // n_rot < head_dim: partial rotary
    ops.rope(k, hp.head_dim, 0, hp.n_rot, rope);
    Act att = ops.alloc(x.rows, n_q);
    ops.attention(il, q, k, v,
                  {hp.n_head, hp.n_head_kv, hp.head_dim, 1.0f / std::sqrt(float(hp.head_dim))},
                  att);
    ops.add(x, ops.matmul(w.wo, att));
    archs::ffn_half(e, il, x, h, moe(il), w.ffn_norm, w.ffn, hp.eps);
  }

  std::vector<std::string> synth_presets() const override { return {"ling-1t"}; }
  expertd::Result<SynthModel> synth(const std::string& preset, const SynthDims& d) const override;

 private:
  struct Layer {
    Tensor attn_norm, wqkv, wo, q_norm, k_norm;
    Tensor ffn_norm;  // dense layers
    FfnWeights ffn;
    MoeWeights moe;
  };
  Hparams hp_;
  RouteOpts route_;
  int n_dense_lead_ = 0;
  int64_t n_ff_ = 0, n_ff_shexp_ = 0;
  std::vector<Layer> layers_;
};

// Ling-1T (1T total, 50B active), inclusionAI/Ling-1T's config.json (BailingMoeV2Config): n_embd
// 8,192, 80 layers of which the first 4 (first_k_dense_replace) are dense of 18,432, 64 heads and
// 8 KV heads of 128 with rotary_dim 64 (NeoX) and per-head q/k norms, 256 routed experts of 2,048
// (top-8 in 4 of 8 groups, sigmoid with the expert bias, renormalised, routed_scaling_factor 2.5)
// and one shared expert, rope base 600,000, RMSNorm eps 1e-6, a 32,768 context, vocabulary
// 157,184 (the bailingmoe2 pre-tokenizer); MTP disabled in the published checkpoint. They give
// the published totals: 256 x 3 x 8,192 x 2,048 x 76 = 979B routed, 999.7B in all; 8 routed
// and the shared expert (34B), attention, the dense layers and embeddings = 50B active.
// --dims: half of each head rotated, one dense lead layer, groups where the experts divide.
expertd::Result<SynthModel> BailingMoe2::synth(const std::string&, const SynthDims& d) const {
  archs::SynthSizes s{8192, 80, 256, 8, 2048, 64, 8, 128, 157184, 600000.0f, 1e-6f, 64};
  int n_ff = 18432, dense = 4, groups = 8, groups_used = 4;
  EXPERTD_TRY(archs::apply_dims(s, d));
  if (d.given()) {
    s.n_rot = s.head_dim / 2, n_ff = 2 * s.n_ff_exp, dense = 1;
    groups = s.n_expert % 4 ? 1 : 4, groups_used = groups > 1 ? 2 : 1;
  }
  if (d.layers > 0) s.n_layer = std::min<int>(s.n_layer, static_cast<int>(d.layers));
  dense = std::min(dense, s.n_layer - 1);
  auto m = archs::synth_base(s, "bailingmoe2");
  if (!m) return m;
  m->u32["context_length"] = 32768;
  m->u32["leading_dense_block_count"] = std::max(dense, 0);
  m->u32["feed_forward_length"] = n_ff;
  m->u32["expert_shared_count"] = 1;
  m->u32["expert_shared_feed_forward_length"] = s.n_ff_exp;
  m->u32["expert_gating_func"] = 2;  // sigmoid
  m->flags["expert_weights_norm"] = true;
  m->f32["expert_weights_scale"] = 2.5f;
  m->u32["expert_group_count"] = groups;
  m->u32["expert_group_used_count"] = groups_used;
  return m;
}

}  // namespace

std::unique_ptr<Arch> make_arch_bailingmoe2() {
  return std::make_unique<BailingMoe2>();
}

}  // namespace engine
