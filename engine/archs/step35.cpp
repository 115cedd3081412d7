// Step 3.5 (step35: StepFun's Step-3.5-Flash and its successors): grouped-query attention with
// per-head q/k RMSNorms (where the file has them), each layer its own query and KV head counts,
// NeoX RoPE over half of each head on global layers and over rope.dimension_count_swa (else
// the whole head) at rope.freq_base_swa on the sliding-window ones (attention.sliding_window_
// pattern, an array); a sigmoid gate per head from the block's input on the attention's output
// where the layer has one; a layer dense or MoE by its router's presence; sigmoid routing with
// the selection bias beside a shared expert, each clamped per layer where the file says
// (swiglu_clamp_exp, swiglu_clamp_shexp: min(silu(g), limit) * clamp(u, -limit, limit)).
// rope_freqs (llama3-style rope frequency factors, one table of max rotated dims / 2 whose first
// entries a layer reads) divide the global layers' angles where the file has them, as llama.cpp
// applies them (the sliding layers take none). The trailing NextN blocks draft, chained
// (llama.cpp's step35 graph_mtp and chain_heads): each a decoder block as the trunk's.
#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/archs/common.h"
#include "engine/engine.h"

namespace engine {
namespace {

class Step35 final : public Arch {
 public:
  void read_hparams(Meta& m, Hparams& hp) override {
    int first_moe = 0;
    const int n_all = archs::read_trunk_by_router(m, hp, moe_, &first_moe), n = hp.n_layer;
    if (!n_all) return;
    hp.n_nextn = archs::nextn_blocks(m, n, n_all, "attention.sliding_window_pattern");
    if (hp.n_nextn > 0) moe_ = archs::moe_by_router(m, n_all);  // dense or MoE by its router too
    const int n_run = n + hp.n_nextn;
    m.per_layer("attention.head_count", n_all, heads_);
    m.per_layer("attention.head_count_kv", n_all, kv_heads_);
    m.u("attention.sliding_window", window_);
    m.f("rope.freq_base_swa", rope_base_swa_, 10000.0f);  // llama.cpp's default
    m.u("rope.dimension_count_swa", n_rot_swa_, hp.n_rot);
    route_ = archs::read_routing(m, hp, /*norm_default=*/false, /*sigmoid_default=*/true);
    int w = 0;
    m.u("expert_shared_feed_forward_length", w, 0);
    archs::read_yarn(m, hp, /*yarn_ok=*/false);
    if (!m.error().empty()) return;
    rope_freqs_.read(m);  // llama3-style rope scaling, on the global layers
    sliding_ = archs::read_swa_pattern(m, n_run, /*default_period=*/-1);  // the array, required
    if (!m.error().empty()) return;
    for (int il = 0; il < n_run; ++il)
      if (kv_heads_[size_t(il)] <= 0 || heads_[size_t(il)] % kv_heads_[size_t(il)])
        return m.fail("attention.head_count[" + std::to_string(il) +
                      "] is not a multiple of its KV head count");
    hp.n_head_kv = kv_heads_[0];
    if (window_ < 1) return m.fail("implausible step35.attention.sliding_window");
    if (n_rot_swa_ > hp.head_dim || n_rot_swa_ % 2 || hp.n_rot % 4)
      return m.fail("implausible rope dimension counts (global layers rotate half of them)");
    clamp_exp_ = archs::per_layer_floats(m, "swiglu_clamp_exp", n_run);
    clamp_shexp_ = archs::per_layer_floats(m, "swiglu_clamp_shexp", n_run);
    n_ff_shexp_ = m.tensor_dim("blk." + std::to_string(first_moe) + ".ffn_gate_shexp.weight", 1);
    if (n_ff_shexp_ == kAnyDim) n_ff_shexp_ = w;
    if (n_ff_shexp_ <= 0)
      return m.fail("missing metadata step35.expert_shared_feed_forward_length");
    for (int il = 0; il < n; ++il)
      if (!moe_[size_t(il)]) {
        n_ff_ = archs::width(m, "blk." + std::to_string(il) + ".ffn_gate.weight", 1,
                             "feed_forward_length");
        break;
      }
  }

  void plan(const Hparams& hp, Plan& p) override {
    hp_ = hp;
    const int64_t n_embd = hp.n_embd;
    rope_freqs_.plan(p, std::max(hp.n_rot / 2, n_rot_swa_));  // llama.cpp's n_rot_max / 2 entries
    layers_.resize(size_t(hp.n_blocks()));
    for (int il = 0; il < hp.n_blocks(); ++il) {
      Layer& w = layers_[size_t(il)];
      const int64_t n_q = heads(il) * hp.head_dim, n_kv = kv(il) * hp.head_dim;
      p.blk(il);
      p.add(w.attn_norm, "attn_norm.weight", {n_embd}, Role::Norm);
      p.add(w.wq, "attn_q.weight", {n_embd, n_q});
      p.add(w.wk, "attn_k.weight", {n_embd, n_kv});
      p.add(w.wv, "attn_v.weight", {n_embd, n_kv});
      p.add(w.wo, "attn_output.weight", {n_q, n_embd}, Role::AttnOut);
      p.optional(w.q_norm, "attn_q_norm.weight", {hp.head_dim}, Role::Norm, /*synth=*/true);
      p.optional(w.k_norm, "attn_k_norm.weight", {hp.head_dim}, Role::Norm, /*synth=*/true);
      p.optional(w.gate, "attn_gate.weight", {n_embd, heads(il)}, Role::Weight, /*synth=*/true);
      if (!moe_[size_t(il)]) {
        p.add(w.ffn_norm, "ffn_norm.weight", {n_embd}, Role::Norm);
        archs::plan_ffn(p, w.ffn, hp, n_ff_);
        continue;
      }
      p.add(w.moe.norm, "ffn_norm.weight", {n_embd}, Role::Norm);
      w.moe.route = route_;
      if (clamp_exp_[size_t(il)] > 1e-6f)
        w.moe.act = {Activation::SwigluClamp, 1.0f, 0.0f, clamp_exp_[size_t(il)]};
      if (clamp_shexp_[size_t(il)] > 1e-6f)
        w.moe.shexp_act = Glu{Activation::SwigluClamp, 1.0f, 0.0f, clamp_shexp_[size_t(il)]};
      else
        w.moe.shexp_act = Glu{};
      p.moe(w.moe, hp);
      archs::plan_shared_expert(p, w.moe, hp, n_ff_shexp_, /*gated=*/false);
    }
  }

  KvRows kv_rows(const Hparams& hp, int il, int) const override {
    return {kv(il) * hp.head_dim, kv(il) * hp.head_dim};
  }
  const MoeWeights* moe(int il) const override {
    return moe_[size_t(il)] ? &layers_[size_t(il)].moe : nullptr;
  }

  void block(Engine& e, int il, Act x) const override {
    Ops& ops = e.ops();
    const Layer& w = layers_[size_t(il)];
    const Hparams& hp = hp_;
    const bool sliding = sliding_[size_t(il)];
    Act h = ops.rms_norm(x, w.attn_norm, hp.eps);
    Act q = ops.matmul(w.wq, h), k = ops.matmul(w.wk, h), v = ops.matmul(w.wv, h);
    if (w.q_norm) ops.rms_norm(q, w.q_norm, q, hp.eps, hp.head_dim);
    if (w.k_norm) ops.rms_norm(k, w.k_norm, k, hp.eps, hp.head_dim);
    RopeOpts rope{sliding ? rope_base_swa_ : hp.rope_base, /*neox=*/true};
    if (!sliding) rope.freq_factors = rope_freqs_.t;
    const int n_rot = sliding ? n_rot_swa_ : hp.n_rot / 2;  // llama.cpp: global layers half
    ops.rope(q, hp.head_dim, 0, n_rot, rope);
    ops.rope(k, hp.head_dim, 0, n_rot, rope);
    AttnOpts a{int(heads(il)), int(kv(il)), hp.head_dim, 1.0f / std::sqrt(float(hp.head_dim))};
    if (sliding) a.window = window_;
    Act att = ops.alloc(x.rows, heads(il) * hp.head_dim);
    ops.attention(il, q, k, v, a, att);
    if (w.gate) ops.mul_act(att, ops.matmul(w.gate, h), Unary::Sigmoid);  // one per head
    ops.add(x, ops.matmul(w.wo, att));
    archs::ffn_half(e, il, x, h, moe(il), w.ffn_norm, w.ffn, hp.eps);
  }

  bool nextn_chain() const override { return true; }
  Act nextn_hidden(Engine&, const Model&, Act x, Act) const override { return x; }
  Act nextn_head(Engine& e, const Model& m, const NextnWeights& w, Act x,
                 Act* next_hidden) const override {
    return archs::nextn_prenorm_head(e, m, w, x, next_hidden);
  }

  std::vector<std::string> synth_presets() const override { return {"step-3.7-flash"}; }
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
  int window_ = 0, n_rot_swa_ = 0;
  float rope_base_swa_ = 10000.0f;
  int64_t n_ff_ = 0, n_ff_shexp_ = 0;
  std::vector<int> heads_, kv_heads_;  // per block (the NextN ones included)
  archs::RopeFreqs rope_freqs_;
  std::vector<float> clamp_exp_, clamp_shexp_;
  std::vector<char> moe_, sliding_;
  std::vector<Layer> layers_;
};

// The shape published for Step-3.5-Flash (196B total, 11B active; its config.json as quoted by
// StepFun's card and model databases): n_embd 4,096, 45 layers and 3 MTP blocks, 64 query heads
// and 8 KV heads of 128 on global layers, one global layer then three sliding ones of 512
// positions, rope bases 5,000,000 (global) and 10,000 (sliding), a dense FFN of 11,264, 288
// routed experts of 1,280 of which 8 route a token beside a shared one of 1,280, vocabulary
// 128,896, RMSNorm eps 1e-5, a 262,144 context. Not quoted (assumptions): 96 query heads on the
// sliding layers, 3 dense lead layers (288 x 3 x 4,096 x 1,280 x 42 = 190B routed; 195.7B in all,
// 10.8B active), no SwiGLU clamps. The issue names the preset step-3.7-flash; no larger
// published Step configuration was found. --dims: the sliding layers' heads twice the global
// ones', windows of 8, one dense lead layer, clamps on the MoE layers (routed 2, shared 1.5), rope
// frequency factors.
expertd::Result<SynthModel> Step35::synth(const std::string&, const SynthDims& d) const {
  archs::SynthSizes s{4096, 45, 288, 8, 1280, 64, 8, 128, 128896, 5000000.0f, 1e-5f};
  int n_ff = 11264, window = 512, swa_heads = 96, dense = 3;
  float clamp = 0.0f, clamp_sh = 0.0f;
  const int nextn = 3;
  EXPERTD_TRY(archs::apply_dims(s, d));
  if (d.given())
    n_ff = 2 * s.n_ff_exp, window = 8, swa_heads = 2 * s.n_head, dense = 1, clamp = 2.0f,
    clamp_sh = 1.5f;
  if (d.layers > 0) s.n_layer = std::min<int>(s.n_layer, static_cast<int>(d.layers));
  dense = std::min(dense, s.n_layer - 1);
  if (s.n_layer < 2) return expertd::make_error("synth step-3.7-flash: needs 2 layers");
  auto m = archs::synth_base(s, "qwen2");
  if (!m) return m;
  const int n_all = s.n_layer + nextn;
  std::vector<int32_t> heads(static_cast<size_t>(n_all)), kv(heads.size()), pattern(heads.size());
  std::vector<float> lim(heads.size()), lim_sh(heads.size());
  for (int il = 0; il < n_all; ++il) {
    const bool sliding = il >= s.n_layer || il % 4 != 0;  // the MTP blocks slide too
    pattern[size_t(il)] = sliding, kv[size_t(il)] = s.n_head_kv;
    heads[size_t(il)] = sliding ? swa_heads : s.n_head;
    const bool moe = il >= dense && il < s.n_layer;
    lim[size_t(il)] = moe ? clamp : 0.0f, lim_sh[size_t(il)] = moe ? clamp_sh : 0.0f;
  }
  m->u32["context_length"] = 262144;
  m->u32["block_count"] = n_all;
  m->u32["nextn_predict_layers"] = nextn;
  m->nextn_like = std::min(s.n_layer - 1, std::max(dense, 1) + (dense % 4 == 0));  // sliding, MoE
  m->u32.erase("attention.head_count");
  m->u32.erase("attention.head_count_kv");
  m->arrays["attention.head_count"] = heads;
  m->arrays["attention.head_count_kv"] = kv;
  m->arrays["attention.sliding_window_pattern"] = pattern;
  m->u32["attention.sliding_window"] = window;
  m->u32["leading_dense_block_count"] = dense;
  m->u32["feed_forward_length"] = n_ff;
  m->u32["expert_shared_feed_forward_length"] = s.n_ff_exp;
  m->u32["expert_gating_func"] = 2;  // sigmoid
  m->flags["expert_weights_norm"] = true;
  m->f32["expert_weights_scale"] = 1.0f;
  m->f32["rope.freq_base_swa"] = 10000.0f;
  if (d.given()) m->flags["synth_rope_freqs"] = true;  // the rope factors, at test size
  if (clamp > 0.0f) {
    m->farrays["swiglu_clamp_exp"] = lim;
    m->farrays["swiglu_clamp_shexp"] = lim_sh;
  }
  return m;
}

}  // namespace

std::unique_ptr<Arch> make_arch_step35() {
  return std::make_unique<Step35>();
}

}  // namespace engine
