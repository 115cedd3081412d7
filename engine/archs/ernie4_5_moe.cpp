// ERNIE 4.5 MoE (ernie4_5-moe: ERNIE-4.5-300B-A47B, 21B-A3B): Llama-style grouped-query
// attention (whole heads rotated, adjacent pairs), leading dense layers, then routed experts
// (softmax gating, the selection bias where the file has one, always renormalised, scaled as the
// file says) beside shared experts where the file has them.
#include <cmath>

#include "engine/archs/common.h"
#include "engine/engine.h"

namespace engine {
namespace {

class Ernie45Moe final : public Arch {
 public:
  void read_hparams(Meta& m, Hparams& hp) override {
    m.u("leading_dense_block_count", n_dense_lead_, 0);
    archs::read_base(m, hp, n_dense_lead_);
    int step = 0;
    m.u("interleave_moe_layer_step", step);
    route_ = archs::read_routing(m, hp, /*norm_default=*/true, /*sigmoid_default=*/false);
    n_ff_shexp_ =
        m.tensor_dim("blk." + std::to_string(n_dense_lead_) + ".ffn_gate_shexp.weight", 1);
    if (n_ff_shexp_ == kAnyDim) {  // a core GGUF keeps the shared expert; else none
      int w = 0;
      m.u("expert_shared_feed_forward_length", w, 0);
      n_ff_shexp_ = w;
    }
    if (n_dense_lead_ > 0)
      n_ff_ = archs::width(m, "blk.0.ffn_gate.weight", 1, "feed_forward_length");
    archs::read_yarn(m, hp, /*yarn_ok=*/false);
    if (!m.error().empty()) return;
    if (n_dense_lead_ >= hp.n_layer) return m.fail("leading_dense_block_count leaves no MoE layer");
    // llama.cpp's loader gives every layer past the dense lead routed experts only, so its graph
    // (dense FFNs on the layers a step skips) runs a step of 1 only.
    if (step != 1)
      return m.fail("interleave_moe_layer_step = " + std::to_string(step) +
                    ": llama.cpp runs ERNIE 4.5 MoE files with every layer after the dense lead "
                    "MoE (a step of 1) only");
    // llama.cpp routes by softmax and renormalises, whatever the file says.
    if (route_.sigmoid || !route_.norm_topk || route_.n_group > 0)
      return m.fail(
          "ernie4_5-moe routes by softmax with renormalised weights; the file's "
          "expert_gating_func / expert_weights_norm / expert groups ask otherwise");
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
    const RopeOpts rope{hp.rope_base, /*neox=*/false};
    Act h = ops.rms_norm(x, w.a.attn_norm, hp.eps);
    Act q = ops.matmul(w.a.wq, h), k = ops.matmul(w.a.wk, h), v = ops.matmul(w.a.wv, h);
    ops.rope(q, hp.head_dim, 0, hp.n_rot, rope);
    ops.rope(k, hp.head_dim, 0, hp.n_rot, rope);
    Act att = ops.alloc(x.rows, archs::q_width(hp));
    ops.attention(il, q, k, v,
                  {hp.n_head, hp.n_head_kv, hp.head_dim, 1.0f / std::sqrt(float(hp.head_dim))},
                  att);
    ops.add(x, ops.matmul(w.a.wo, att));
    archs::ffn_half(e, il, x, h, moe(il), w.ffn_norm, w.ffn, hp.eps);
  }

  std::vector<std::string> synth_presets() const override { return {"ernie-4.5-300b-a47b"}; }
  expertd::Result<SynthModel> synth(const std::string& preset, const SynthDims& d) const override;

 private:
  struct Layer {
    archs::GqaWeights a;
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

// ERNIE-4.5-300B-A47B, baidu/ERNIE-4.5-300B-A47B-PT's config.json: n_embd 8,192, 54 layers of
// which the first 3 (moe_layer_start_index) are dense of 28,672, 64 heads and 8 KV heads of 128,
// 64 experts of 3,584 (moe_k 8, moe_layer_interval 1), no shared experts, vocabulary 103,424,
// rope base 500,000, RMSNorm eps 1e-5, a 131,072 context. They give the published totals:
// 64 x 3 x 8,192 x 3,584 x 51 = 287B routed, 300B in all; 8 of the 64 experts, attention,
// the dense layers and embeddings = 47B active. (MTP layers: the converter does not write them.)
// --dims: one dense lead layer and a shared expert (ERNIE-4.5-21B-A3B has them), so that the test
// size has every feature the architecture reads.
expertd::Result<SynthModel> Ernie45Moe::synth(const std::string&, const SynthDims& d) const {
  archs::SynthSizes s{8192, 54, 64, 8, 3584, 64, 8, 128, 103424, 500000.0f, 1e-5f};
  int n_ff = 28672, dense = 3, shexp = 0;
  EXPERTD_TRY(archs::apply_dims(s, d));
  if (d.given()) n_ff = 2 * s.n_ff_exp, dense = 1, shexp = 2 * s.n_ff_exp;
  if (d.layers > 0) s.n_layer = std::min<int>(s.n_layer, static_cast<int>(d.layers));
  dense = std::min(dense, s.n_layer - 1);
  // (real ERNIE GGUFs carry a SentencePiece vocabulary; the synthetic one is BPE)
  auto m = archs::synth_base(s, "llama-bpe");
  if (!m) return m;
  m->u32["context_length"] = 131072;
  m->u32["leading_dense_block_count"] = std::max(dense, 0);
  m->u32["interleave_moe_layer_step"] = 1;
  m->u32["feed_forward_length"] = n_ff;
  if (shexp > 0) {
    m->u32["expert_shared_count"] = 2;
    m->u32["expert_shared_feed_forward_length"] = shexp;
  }
  return m;
}

}  // namespace

std::unique_ptr<Arch> make_arch_ernie4_5_moe() {
  return std::make_unique<Ernie45Moe>();
}

}  // namespace engine
