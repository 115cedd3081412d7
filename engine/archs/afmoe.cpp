// Trinity (afmoe: Arcee's Trinity-Large, Mini, Nano): embeddings scaled by sqrt(n_embd) (muP);
// grouped-query attention with per-head q/k RMSNorms, NeoX RoPE on three layers of four (the
// fourth has no position encoding; llama.cpp's fixed step of 4) with the sliding-window layers'
// own base, windows where the file gives one (attention.sliding_window_pattern: an array, or a
// period, default 4), a sigmoid gate from the block's input on the attention's output before
// attn_output; sandwich norms (an RMSNorm after attention and after the FFN, before each
// residual add); leading dense layers, then sigmoid routing with the selection bias,
// renormalised and scaled as the file says, beside shared experts.
#include <cmath>
#include <vector>

#include "engine/archs/common.h"
#include "engine/engine.h"

namespace engine {
namespace {

class Afmoe final : public Arch {
 public:
  void read_hparams(Meta& m, Hparams& hp) override {
    m.u("leading_dense_block_count", n_dense_lead_, 0);
    archs::read_base(m, hp, n_dense_lead_);
    int n_shared = 0;
    m.u("expert_shared_count", n_shared);
    m.u("attention.sliding_window", window_, 0);
    route_ = archs::read_routing(m, hp, /*norm_default=*/false, /*sigmoid_default=*/true);
    archs::read_yarn(m, hp, /*yarn_ok=*/false);
    if (!m.error().empty()) return;
    if (n_dense_lead_ >= hp.n_layer) return m.fail("leading_dense_block_count leaves no MoE layer");
    if (n_dense_lead_ > 0)
      n_ff_ = archs::width(m, "blk.0.ffn_gate.weight", 1, "feed_forward_length");
    n_ff_shexp_ = hp.n_ff_exp * n_shared;  // llama.cpp: the expert width times the count
    rope_base_swa_ = hp.rope_base;
    sliding_.assign(size_t(hp.n_layer), 0);
    if (window_ > 0) {
      m.f("rope.freq_base_swa", rope_base_swa_, hp.rope_base);
      sliding_ = archs::read_swa_pattern(m, hp.n_layer, 4);
      if (!m.error().empty()) return;
    }
    if (hp.n_rot != hp.head_dim)
      return m.fail("rope.dimension_count must be the head size (llama.cpp rotates whole heads)");
  }

  void plan(const Hparams& hp, Plan& p) override {
    hp_ = hp;
    const int64_t n_embd = hp.n_embd;
    layers_.resize(size_t(hp.n_layer));
    for (int il = 0; il < hp.n_layer; ++il) {
      Layer& w = layers_[size_t(il)];
      p.blk(il);
      archs::plan_gqa(p, w.a, hp);
      p.add(w.post_attn_norm, "post_attention_norm.weight", {n_embd}, Role::Norm);
      p.add(w.q_norm, "attn_q_norm.weight", {hp.head_dim}, Role::Norm);
      p.add(w.k_norm, "attn_k_norm.weight", {hp.head_dim}, Role::Norm);
      p.add(w.gate, "attn_gate.weight", {n_embd, archs::q_width(hp)});
      p.add(w.post_ffn_norm, "post_ffw_norm.weight", {n_embd}, Role::Norm);
      if (il < n_dense_lead_) {
        p.add(w.ffn_norm, "ffn_norm.weight", {n_embd}, Role::Norm);
        archs::plan_ffn(p, w.ffn, hp, n_ff_);
        continue;
      }
      p.add(w.moe.norm, "ffn_norm.weight", {n_embd}, Role::Norm);
      w.moe.route = route_;
      p.moe(w.moe, hp);
      if (n_ff_shexp_ > 0) archs::plan_shared_expert(p, w.moe, hp, n_ff_shexp_, /*gated=*/false);
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
    const bool sliding = sliding_[size_t(il)];
    if (il == 0) {  // muP: the embeddings times sqrt(n_embd)
      const std::vector<float> f(size_t(x.rows), std::sqrt(float(hp.n_embd)));
      ops.scale_rows(x, f);
    }
    Act h = ops.rms_norm(x, w.a.attn_norm, hp.eps);
    Act q = ops.matmul(w.a.wq, h), k = ops.matmul(w.a.wk, h), v = ops.matmul(w.a.wv, h);
    Act gate = ops.matmul(w.gate, h);
    ops.rms_norm(q, w.q_norm, q, hp.eps, hp.head_dim);
    ops.rms_norm(k, w.k_norm, k, hp.eps, hp.head_dim);
    if ((il + 1) % 4 != 0) {
      const RopeOpts rope{sliding ? rope_base_swa_ : hp.rope_base, /*neox=*/true};
      ops.rope(q, hp.head_dim, 0, hp.n_rot, rope);
      ops.rope(k, hp.head_dim, 0, hp.n_rot, rope);
    }
    AttnOpts a{hp.n_head, hp.n_head_kv, hp.head_dim, 1.0f / std::sqrt(float(hp.head_dim))};
    if (sliding) a.window = window_;
    Act att = ops.alloc(x.rows, archs::q_width(hp));
    ops.attention(il, q, k, v, a, att);
    ops.mul_act(att, gate, Unary::Sigmoid);
    Act o = ops.matmul(w.a.wo, att);
    ops.rms_norm(o, w.post_attn_norm, o, hp.eps);
    ops.add(x, o);
    Act y = archs::ffn_out(e, il, x, h, moe(il), w.ffn_norm, w.ffn, hp.eps);
    ops.rms_norm(y, w.post_ffn_norm, y, hp.eps);
    ops.add(x, y);
  }

  std::vector<std::string> synth_presets() const override { return {"trinity-large"}; }
  expertd::Result<SynthModel> synth(const std::string& preset, const SynthDims& d) const override;

 private:
  struct Layer {
    archs::GqaWeights a;
    Tensor q_norm, k_norm, gate, post_attn_norm, post_ffn_norm;
    Tensor ffn_norm;  // dense layers
    FfnWeights ffn;
    MoeWeights moe;
  };
  Hparams hp_;
  RouteOpts route_;
  int n_dense_lead_ = 0, window_ = 0;
  float rope_base_swa_ = 0;
  int64_t n_ff_ = 0, n_ff_shexp_ = 0;
  std::vector<char> sliding_;  // per layer: a sliding-window layer
  std::vector<Layer> layers_;
};

// Trinity-Large (398B total, 13B active; Arcee's technical report, arXiv:2602.17004, and model
// cards): n_embd 3,072, 60 layers of which 6 are dense, 48 heads and 8 KV heads (head size 128,
// the AFMoE configs' default), 256 routed experts of which 4 route a token beside 1 shared,
// sigmoid routing with the expert bias, local windows of 4,096 interleaved 3:1 with global
// layers, a 512K context, vocabulary 200,192 (every AFMoE config). Not quoted, and chosen so
// the totals come out: experts of 3,072 (256 x 3 x 3,072 x 3,072 x 54 = 391B routed, 398.6B in
// all with dense layers of 12,288, the shared experts, attention and embeddings; 13.3B active).
// The rope bases (10,000), the routed scale (1) and the RMSNorm epsilon (1e-5) are assumptions.
// --dims: one dense lead layer, windows of 8 (a 40-token prompt slides past them).
expertd::Result<SynthModel> Afmoe::synth(const std::string&, const SynthDims& d) const {
  archs::SynthSizes s{3072, 60, 256, 4, 3072, 48, 8, 128, 200192, 10000.0f, 1e-5f};
  int n_ff = 12288, dense = 6, window = 4096;
  EXPERTD_TRY(archs::apply_dims(s, d));
  if (d.given()) n_ff = 2 * s.n_ff_exp, dense = 1, window = 8;
  if (d.layers > 0) s.n_layer = std::min<int>(s.n_layer, static_cast<int>(d.layers));
  dense = std::min(dense, s.n_layer - 1);
  auto m = archs::synth_base(s, "afmoe");
  if (!m) return m;
  m->u32["context_length"] = 524288;
  m->u32["leading_dense_block_count"] = std::max(dense, 0);
  m->u32["feed_forward_length"] = n_ff;
  m->u32["expert_shared_count"] = 1;
  m->u32["expert_gating_func"] = 2;  // sigmoid
  m->flags["expert_weights_norm"] = true;
  m->f32["expert_weights_scale"] = 1.0f;
  m->u32["attention.sliding_window"] = window;
  return m;
}

}  // namespace

std::unique_ptr<Arch> make_arch_afmoe() {
  return std::make_unique<Afmoe>();
}

}  // namespace engine
