// K-EXAONE (exaone-moe: K-EXAONE-236B-A23B): grouped-query attention with per-head q/k RMSNorms,
// sliding-window layers that rotate (whole heads, NeoX) and global layers with no position
// encoding at all, leading dense layers, then routed experts beside a shared one (the gating
// function, selection bias, renormalisation and scale the file gives). The layers' kinds: the
// file's attention.sliding_window_pattern, an array (true: sliding) or a period n (layer il
// slides unless il % n == n - 1; llama.cpp's default 4). Trailing NextN blocks are skipped.
#include <cmath>

#include "engine/archs/common.h"
#include "engine/engine.h"

namespace engine {
namespace {

class ExaoneMoe final : public Arch {
 public:
  void read_hparams(Meta& m, Hparams& hp) override {
    m.u("leading_dense_block_count", n_dense_lead_, 0);
    archs::read_base(m, hp, n_dense_lead_);
    int nextn = 0;
    m.u("nextn_predict_layers", nextn, 0);
    m.u("attention.sliding_window", window_);
    if (!m.has("expert_gating_func")) m.fail("missing metadata exaone-moe.expert_gating_func");
    route_ = archs::read_routing(m, hp, /*norm_default=*/false, /*sigmoid_default=*/true);
    archs::read_yarn(m, hp, /*yarn_ok=*/false);
    if (!m.error().empty()) return;
    if (nextn >= hp.n_layer) return m.fail("nextn_predict_layers leaves no layer to run");
    hp.n_layer -= nextn;
    if (n_dense_lead_ >= hp.n_layer) return m.fail("leading_dense_block_count leaves no MoE layer");
    if (window_ < 1) return m.fail("implausible exaone-moe.attention.sliding_window");
    if (hp.n_rot != hp.head_dim)
      return m.fail("rope.dimension_count must be the head size (llama.cpp rotates whole heads)");
    // rope_freqs (llama3-style rope scaling): the op exists (RopeOpts::freq_factors, Llama 4's),
    // but llama.cpp cannot load an exaone-moe file with them beside its MTP block ("too many
    // tensors"), so there is nothing to check such a file against: refused rather than guessed.
    if (m.file().tensor("rope_freqs.weight"))
      return m.fail("rope_freqs.weight (rope frequency factors) is not supported");
    sliding_ = archs::read_swa_pattern(m, hp.n_layer, 4);
    if (!m.error().empty()) return;
    n_ff_shexp_ =
        m.tensor_dim("blk." + std::to_string(n_dense_lead_) + ".ffn_gate_shexp.weight", 1);
    if (n_ff_shexp_ == kAnyDim) {
      int w = 0;
      m.u("expert_shared_feed_forward_length", w, 0);
      n_ff_shexp_ = w ? w : hp.n_ff_exp;
    }
    if (n_dense_lead_ > 0)
      n_ff_ = archs::width(m, "blk.0.ffn_gate.weight", 1, "feed_forward_length");
  }

  void plan(const Hparams& hp, Plan& p) override {
    hp_ = hp;
    const int64_t n_embd = hp.n_embd;
    layers_.resize(size_t(hp.n_layer));
    for (int il = 0; il < hp.n_layer; ++il) {
      Layer& w = layers_[size_t(il)];
      p.blk(il);
      archs::plan_gqa(p, w.a, hp);
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
    const bool sliding = sliding_[size_t(il)];
    Act h = ops.rms_norm(x, w.a.attn_norm, hp.eps);
    Act q = ops.matmul(w.a.wq, h), k = ops.matmul(w.a.wk, h), v = ops.matmul(w.a.wv, h);
    ops.rms_norm(q, w.q_norm, q, hp.eps, hp.head_dim);
    ops.rms_norm(k, w.k_norm, k, hp.eps, hp.head_dim);
    if (sliding) {  // the global layers have no position encoding
      const RopeOpts rope{hp.rope_base, /*neox=*/true};
      ops.rope(q, hp.head_dim, 0, hp.n_rot, rope);
      ops.rope(k, hp.head_dim, 0, hp.n_rot, rope);
    }
    AttnOpts a{hp.n_head, hp.n_head_kv, hp.head_dim, 1.0f / std::sqrt(float(hp.head_dim))};
    if (sliding) a.window = window_;
    Act att = ops.alloc(x.rows, archs::q_width(hp));
    ops.attention(il, q, k, v, a, att);
    ops.add(x, ops.matmul(w.a.wo, att));
    archs::ffn_half(e, il, x, h, moe(il), w.ffn_norm, w.ffn, hp.eps);
  }

  // The name and the model's full one: the same shape.
  std::vector<std::string> synth_presets() const override {
    return {"k-exaone-236b", "k-exaone-236b-a23b"};
  }
  expertd::Result<SynthModel> synth(const std::string& preset, const SynthDims& d) const override;

 private:
  struct Layer {
    archs::GqaWeights a;
    Tensor q_norm, k_norm;
    Tensor ffn_norm;  // dense layers
    FfnWeights ffn;
    MoeWeights moe;
  };
  Hparams hp_;
  RouteOpts route_;
  int n_dense_lead_ = 0, window_ = 0;
  int64_t n_ff_ = 0, n_ff_shexp_ = 0;
  std::vector<char> sliding_;  // per layer: a sliding-window (rotated) layer, else global
  std::vector<Layer> layers_;
};

// K-EXAONE-236B-A23B: 128 routed experts, 8 active, 236B total and 23B active (LG AI Research's
// model card, NVIDIA-NeMo/Megatron-Bridge's K-EXAONE example); its config.json: n_embd 6,144, 48
// layers of which the first is dense of 18,432, 64 heads and 8 KV heads of 128, experts of 2,048
// and one shared expert, sigmoid routing with the selection bias, renormalised, scale 2.5,
// sliding windows of 128 in the pattern LLLG, rope base 1,000,000, RMSNorm eps 1e-5, a 262,144
// context, vocabulary 153,600, one MTP layer (the GGUF model cards keep it). They reproduce the
// totals: 128 x 3 x 6,144 x 2,048 x 47 = 227B routed, 236B in all; 8 routed and the shared expert
// (16B), attention, the dense layer and embeddings = 23B active.
// --dims: windows of 8 (a 40-token prompt slides past them), the MTP layer as a dense-lead-like
// block (llama.cpp's loader plans it with a dense FFN).
expertd::Result<SynthModel> ExaoneMoe::synth(const std::string&, const SynthDims& d) const {
  archs::SynthSizes s{6144, 48, 128, 8, 2048, 64, 8, 128, 153600, 1e6f, 1e-5f};
  int n_ff = 18432, window = 128;
  EXPERTD_TRY(archs::apply_dims(s, d));
  if (d.given()) n_ff = 2 * s.n_ff_exp, window = 8;
  if (d.layers > 0) s.n_layer = std::min<int>(s.n_layer, static_cast<int>(d.layers));
  if (s.n_layer < 2) return expertd::make_error("k-exaone: at least 2 layers (a dense lead one)");
  auto m = archs::synth_base(s, "exaone-moe");
  if (!m) return m;
  m->u32["context_length"] = 262144;
  m->u32["leading_dense_block_count"] = 1;
  m->u32["feed_forward_length"] = n_ff;
  m->u32["expert_shared_count"] = 1;
  m->u32["expert_shared_feed_forward_length"] = s.n_ff_exp;
  m->u32["expert_gating_func"] = 2;  // sigmoid
  m->flags["expert_weights_norm"] = true;
  m->f32["expert_weights_scale"] = 2.5f;
  m->u32["attention.sliding_window"] = window;
  m->u32["attention.sliding_window_pattern"] = 4;
  m->u32["block_count"] += 1;  // the MTP layer
  m->u32["nextn_predict_layers"] = 1;
  m->nextn_like = 0;  // a dense layer's tensors, as llama.cpp plans the MTP block
  return m;
}

}  // namespace

std::unique_ptr<Arch> make_arch_exaone_moe() {
  return std::make_unique<ExaoneMoe>();
}

}  // namespace engine
