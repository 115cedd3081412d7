// GLM-4.5 / GLM-4.5-Air / GLM-4.6 (glm4moe): q/k/v biases, partial NeoX RoPE, optional per-head
// q/k norms, leading dense layers, sigmoid gating with the exp_probs_b selection bias, an ungated
// shared expert, the post-attention norm before the FFN, and trailing NextN (multi-token
// prediction) blocks: a decoder block like the trunk's MoE ones, run to draft (Engine::nextn).
#include "engine/archs/common.h"
#include "engine/engine.h"

namespace engine {
namespace {

class Glm4Moe final : public Arch {
 public:
  void read_hparams(Meta& m, Hparams& hp) override {
    m.u("leading_dense_block_count", n_dense_lead_, 0);
    archs::read_base(m, hp, n_dense_lead_);
    int nextn = 0;
    m.u("nextn_predict_layers", nextn, 0);
    if (m.error().empty() && nextn >= hp.n_layer)
      return m.fail("nextn_predict_layers leaves no layer to run");
    hp.n_layer -= nextn;
    // The NextN blocks this engine can run: where the file has them (llama.cpp's probe).
    if (nextn > 0 &&
        m.tensor_dim("blk." + std::to_string(hp.n_layer) + ".nextn.eh_proj.weight", 0) != kAnyDim)
      hp.n_nextn = nextn;
    if (n_dense_lead_ > hp.n_layer) return m.fail("leading_dense_block_count exceeds block_count");
    route_ = archs::read_routing(m, hp, /*norm_default=*/false, /*sigmoid_default=*/true);
    int n_shared = 0;
    m.u("expert_shared_count", n_shared, 0);
    if (n_shared > 0) {  // the shared experts as one FFN, n_shared times an expert's width
      n_ff_shexp_ =
          m.tensor_dim("blk." + std::to_string(n_dense_lead_) + ".ffn_gate_shexp.weight", 1);
      if (n_ff_shexp_ == kAnyDim) n_ff_shexp_ = hp.n_ff_exp * n_shared;
    }
    if (n_dense_lead_ > 0)
      n_ff_ = archs::width(m, "blk.0.ffn_gate.weight", 1, "feed_forward_length");
    archs::read_yarn(m, hp, /*yarn_ok=*/false);
  }

  void plan(const Hparams& hp, Plan& p) override {
    hp_ = hp;
    const int64_t n_embd = hp.n_embd, head_dim = hp.head_dim, n_q = archs::q_width(hp),
                  n_kv = archs::kv_width(hp);
    layers_.resize(hp.n_blocks());
    for (int il = 0; il < hp.n_blocks(); ++il) {
      Layer& w = layers_[il];
      p.blk(il);
      p.add(w.attn_norm, "attn_norm.weight", {n_embd}, Role::Norm);
      p.add(w.wq, "attn_q.weight", {n_embd, n_q});
      p.add(w.wk, "attn_k.weight", {n_embd, n_kv});
      p.add(w.wv, "attn_v.weight", {n_embd, n_kv});
      p.add(w.bq, "attn_q.bias", {n_q}, Role::Bias);
      p.add(w.bk, "attn_k.bias", {n_kv}, Role::Bias);
      p.add(w.bv, "attn_v.bias", {n_kv}, Role::Bias);
      // per head, where the model has them
      p.optional(w.q_norm, "attn_q_norm.weight", {head_dim}, Role::Norm);
      p.optional(w.k_norm, "attn_k_norm.weight", {head_dim}, Role::Norm);
      p.add(w.wo, "attn_output.weight", {n_q, n_embd}, Role::AttnOut);
      if (il < n_dense_lead_) {
        p.add(w.ffn_norm, "post_attention_norm.weight", {n_embd}, Role::Norm);
        archs::plan_ffn(p, w.ffn, hp, n_ff_);
        continue;
      }
      p.add(w.moe.norm, "post_attention_norm.weight", {n_embd}, Role::Norm);
      w.moe.route = route_;
      p.moe(w.moe, hp);
      if (n_ff_shexp_ > 0) archs::plan_shared_expert(p, w.moe, hp, n_ff_shexp_, /*gated=*/false);
    }
  }

  KvRows kv_rows(const Hparams& hp, int, int) const override { return archs::gqa_rows(hp); }
  const MoeWeights* moe(int il) const override {
    return il < n_dense_lead_ ? nullptr : &layers_[il].moe;
  }

  void block(Engine& e, int il, Act x) const override {
    Ops& ops = e.ops();
    const Layer& w = layers_[il];
    const Hparams& hp = hp_;
    const RopeOpts rope{hp.rope_base, /*neox=*/true};
    Act h = ops.rms_norm(x, w.attn_norm, hp.eps);
    Act q = ops.matmul(w.wq, h), k = ops.matmul(w.wk, h), v = ops.matmul(w.wv, h);
    ops.add_bias(q, w.bq);
    ops.add_bias(k, w.bk);
    ops.add_bias(v, w.bv);
    if (w.q_norm) {
      ops.rms_norm(q, w.q_norm, q, hp.eps, hp.head_dim);
      ops.rms_norm(k, w.k_norm, k, hp.eps, hp.head_dim);
    }
    ops.rope(q, hp.head_dim, 0, hp.n_rot, rope);  // n_rot < head_dim: partial rotary
    ops.rope(k, hp.head_dim, 0, hp.n_rot, rope);
    Act att = ops.alloc(x.rows, archs::q_width(hp));
    ops.attention(il, q, k, v,
                  {hp.n_head, hp.n_head_kv, hp.head_dim, 1.0f / std::sqrt(float(hp.head_dim))},
                  att);
    ops.add(x, ops.matmul(w.wo, att));
    if (il < n_dense_lead_) {
      ops.rms_norm(x, w.ffn_norm, h, hp.eps);
      Act y = ops.alloc(x.rows, hp.n_embd);
      ops.ffn(w.ffn, h, y);
      ops.add(x, y);
      return;
    }
    ops.rms_norm(x, w.moe.norm, h, hp.eps);
    ops.add(x, e.moe(il, w.moe, h));
  }

  std::vector<std::string> synth_presets() const override { return {"glm-4.5-air"}; }
  expertd::Result<SynthModel> synth(const std::string&, const SynthDims& d) const override {
    archs::SynthSizes s{4096, 46, 128, 8, 1408, 96, 8, 128, 151552, 1e6f, 1e-5f, 64};
    int n_ff = 10944;
    EXPERTD_TRY(archs::apply_dims(s, d));
    if (d.given()) s.n_rot = s.head_dim / 2, n_ff = 2 * s.n_ff_exp;
    auto m = archs::synth_base(s, "qwen2");
    if (!m) return m;
    // GLM-4.5-Air: half of each head rotated, one leading dense layer, one shared expert,
    // sigmoid gating with renormalised weights (and a selection bias: the plan's).
    m->u32["leading_dense_block_count"] = 1;
    m->u32["expert_shared_count"] = 1;
    m->u32["feed_forward_length"] = n_ff;
    m->u32["expert_gating_func"] = 2;
    // One NextN (multi-token prediction) block after the trunk, as the published models carry
    // (GLM-4.5-Air: 46 blocks and the 47th).
    m->u32["nextn_predict_layers"] = 1;
    m->u32["block_count"] += 1;
    m->f32["expert_weights_scale"] = 1.0f;
    m->flags["expert_weights_norm"] = true;
    return m;
  }

 private:
  struct Layer {
    Tensor attn_norm, wq, wk, wv, bq, bk, bv, q_norm, k_norm, wo;
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

}  // namespace

std::unique_ptr<Arch> make_arch_glm4moe() {
  return std::make_unique<Glm4Moe>();
}

}  // namespace engine
