// Hy3 (hy_v3: Tencent Hy3-preview, 295B-A21B): grouped-query attention with per-head q/k
// RMSNorms and NeoX RoPE over whole heads; a layer is dense or MoE by whether the file has its
// router (ffn_gate_inp), as llama.cpp decides; routed experts by sigmoid with the selection bias
// (named exp_probs_b, without .bias), renormalised and scaled as the file says, beside one
// ungated shared expert. The trailing NextN block (nextn_predict_layers) runs to draft
// (Engine::set_nextn: a decoder block as the trunk's, llama.cpp's hy-v3 graph_mtp).
#include <algorithm>
#include <cmath>

#include "engine/archs/common.h"
#include "engine/engine.h"

namespace engine {
namespace {

class HyV3 final : public Arch {
 public:
  void read_hparams(Meta& m, Hparams& hp) override {
    int first_moe = 0;
    const int n_all = archs::read_trunk_by_router(m, hp, moe_, &first_moe);
    if (!n_all) return;
    if (n_all > hp.n_layer &&
        m.tensor_dim(blk(hp.n_layer) + "nextn.eh_proj.weight", 0) != kAnyDim) {
      hp.n_nextn = n_all - hp.n_layer;  // dense or MoE by its router too
      moe_ = archs::moe_by_router(m, n_all);
    }
    route_ = archs::read_routing(m, hp, /*norm_default=*/false, /*sigmoid_default=*/true);
    if (route_.n_group > 0) return m.fail("hy_v3 routes without expert groups");
    n_ff_shexp_ = archs::width(m, blk(first_moe) + "ffn_gate_shexp.weight", 1,
                               "expert_shared_feed_forward_length");
    for (int il = 0; il < hp.n_layer; ++il)
      if (!moe_[size_t(il)]) {
        n_ff_ = archs::width(m, blk(il) + "ffn_gate.weight", 1, "feed_forward_length");
        break;
      }
    archs::read_yarn(m, hp, /*yarn_ok=*/false);
    if (!m.error().empty()) return;
    if (hp.n_rot != hp.head_dim)
      return m.fail("rope.dimension_count must be the head size (llama.cpp rotates whole heads)");
  }

  void plan(const Hparams& hp, Plan& p) override {
    hp_ = hp;
    const int64_t n_embd = hp.n_embd;
    layers_.resize(size_t(hp.n_blocks()));
    for (int il = 0; il < hp.n_blocks(); ++il) {
      Layer& w = layers_[size_t(il)];
      p.blk(il);
      archs::plan_gqa(p, w.a, hp);
      p.add(w.q_norm, "attn_q_norm.weight", {hp.head_dim}, Role::Norm);
      p.add(w.k_norm, "attn_k_norm.weight", {hp.head_dim}, Role::Norm);
      if (!moe_[size_t(il)]) {
        p.add(w.ffn_norm, "ffn_norm.weight", {n_embd}, Role::Norm);
        archs::plan_ffn(p, w.ffn, hp, n_ff_);
        continue;
      }
      p.add(w.moe.norm, "ffn_norm.weight", {n_embd}, Role::Norm);
      w.moe.route = route_;
      w.moe.exp_probs_b_name = "exp_probs_b";
      p.moe(w.moe, hp);
      archs::plan_shared_expert(p, w.moe, hp, n_ff_shexp_, /*gated=*/false);
    }
  }

  KvRows kv_rows(const Hparams& hp, int, int) const override { return archs::gqa_rows(hp); }
  const MoeWeights* moe(int il) const override {
    return moe_[size_t(il)] ? &layers_[size_t(il)].moe : nullptr;
  }

  void block(Engine& e, int il, Act x) const override {
    Ops& ops = e.ops();
    const Layer& w = layers_[size_t(il)];
    const Hparams& hp = hp_;
    const RopeOpts rope{hp.rope_base, /*neox=*/true};
    Act h = ops.rms_norm(x, w.a.attn_norm, hp.eps);
    Act q = ops.matmul(w.a.wq, h), k = ops.matmul(w.a.wk, h), v = ops.matmul(w.a.wv, h);
    ops.rms_norm(q, w.q_norm, q, hp.eps, hp.head_dim);
    ops.rms_norm(k, w.k_norm, k, hp.eps, hp.head_dim);
    ops.rope(q, hp.head_dim, 0, hp.n_rot, rope);
    ops.rope(k, hp.head_dim, 0, hp.n_rot, rope);
    Act att = ops.alloc(x.rows, archs::q_width(hp));
    ops.attention(il, q, k, v,
                  {hp.n_head, hp.n_head_kv, hp.head_dim, 1.0f / std::sqrt(float(hp.head_dim))},
                  att);
    ops.add(x, ops.matmul(w.a.wo, att));
    archs::ffn_half(e, il, x, h, moe(il), w.ffn_norm, w.ffn, hp.eps);
  }

  std::vector<std::string> synth_presets() const override { return {"hy3"}; }
  expertd::Result<SynthModel> synth(const std::string& preset, const SynthDims& d) const override;

 private:
  static std::string blk(int il) { return "blk." + std::to_string(il) + "."; }
  struct Layer {
    archs::GqaWeights a;
    Tensor q_norm, k_norm;
    Tensor ffn_norm;  // dense layers
    FfnWeights ffn;
    MoeWeights moe;
  };
  Hparams hp_;
  RouteOpts route_;
  std::vector<char> moe_;  // per layer: routed experts (else a dense FFN)
  int64_t n_ff_ = 0, n_ff_shexp_ = 0;
  std::vector<Layer> layers_;
};

// Hy3-preview (295B total, 21B active, one 3.8B MTP layer), tencent/Hy3-preview's model card:
// n_embd 4,096, 80 layers (the first dense, of 13,312), 64 heads and 8 KV heads of 128, 192
// experts of which 8 route a token, vocabulary 120,832, a 256K context; its config.json, as NVIDIA
// NeMo's HYV3 documentation quotes it: one shared expert, sigmoid routing with the expert bias,
// per-head q/k RMSNorm, rope_theta 11,158,840. The expert width is not quoted: 1,536 is the one
// that gives the published totals, 192 x 3 x 4,096 x 1,536 x 79 = 286B routed and 295B in all;
// 8 routed and the shared expert, attention, the dense layer and embeddings = 20.6B active. The
// RMSNorm epsilon (1e-5) and the routed scale (1, the converter's default) are assumptions.
// llama.cpp's converter names no Hy3 tokenizer: the synthetic one uses the split its other
// current Tencent models (Hunyuan dense, Hy4) share.
// --dims: one dense lead layer, the shared expert as wide as a routed one, the MTP block kept.
expertd::Result<SynthModel> HyV3::synth(const std::string&, const SynthDims& d) const {
  archs::SynthSizes s{4096, 80, 192, 8, 1536, 64, 8, 128, 120832, 11158840.0f, 1e-5f};
  int n_ff = 13312;
  EXPERTD_TRY(archs::apply_dims(s, d));
  if (d.given()) n_ff = 2 * s.n_ff_exp;
  if (d.layers > 0) s.n_layer = std::min<int>(s.n_layer, static_cast<int>(d.layers));
  if (s.n_layer < 2) return expertd::make_error("synth hy3: needs 2 layers (a dense one first)");
  auto m = archs::synth_base(s, "hunyuan-dense");
  if (!m) return m;
  m->u32["context_length"] = 262144;
  m->u32["block_count"] = s.n_layer + 1;  // the MTP block after the trunk
  m->u32["nextn_predict_layers"] = 1;
  m->u32["leading_dense_block_count"] = 1;  // (read by our planner only: archs::moe_by_router)
  m->u32["feed_forward_length"] = n_ff;
  m->u32["expert_shared_feed_forward_length"] = s.n_ff_exp;
  m->u32["expert_gating_func"] = 2;  // sigmoid
  m->flags["expert_weights_norm"] = true;
  m->f32["expert_weights_scale"] = 1.0f;
  return m;
}

}  // namespace

std::unique_ptr<Arch> make_arch_hy_v3() {
  return std::make_unique<HyV3>();
}

}  // namespace engine
