// MiMo-V2 (mimo2: Xiaomi MiMo-V2-Flash, V2.5): grouped-query attention whose keys and values have
// different head sizes, each layer its own KV head count (head_count_kv: an array), partial NeoX
// RoPE; sliding-window layers (attention.sliding_window_pattern, an array: 1 slides) with their
// own rope base (rope.freq_base_swa, else 10,000 as llama.cpp has it) and global ones; attention
// sinks where a layer has them; the attention's output times attention.value_scale where the file
// gives one; a layer dense or MoE by its router's presence; sigmoid routing with the selection
// bias, always renormalised, scaled as the file says; no shared expert. The q, k and v
// projections separate or fused (attn_qkv). The trailing NextN blocks draft, chained (llama.cpp's
// mimo2 graph_mtp and chain_heads): each a sliding or global attention layer by the pattern, its
// q, k and v fused, a dense FFN, its head norm shared_head_norm or layer_output_norm.
#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/archs/common.h"
#include "engine/engine.h"

namespace engine {
namespace {

class Mimo2 final : public Arch {
 public:
  void read_hparams(Meta& m, Hparams& hp) override {
    int first_moe = 0;
    const int n_all = archs::read_trunk_by_router(m, hp, moe_, &first_moe), n = hp.n_layer;
    if (!n_all) return;
    hp.n_nextn = archs::nextn_blocks(m, n, n_all, "attention.sliding_window_pattern");
    moe_.resize(size_t(n_all), 0);  // llama.cpp's MiMo-V2 MTP blocks are dense
    m.per_layer("attention.head_count_kv", n_all, kv_heads_);
    m.u("attention.value_length", dv_, hp.head_dim);
    m.u("attention.sliding_window", window_);
    m.f("rope.freq_base_swa", rope_base_swa_, 10000.0f);
    m.f("attention.value_scale", value_scale_, 1.0f);
    route_ = archs::read_routing(m, hp, /*norm_default=*/true, /*sigmoid_default=*/true);
    archs::read_yarn(m, hp, /*yarn_ok=*/false);
    if (!m.error().empty()) return;
    // llama.cpp routes MiMo-V2 by sigmoid, renormalised, whatever the file says
    route_.sigmoid = true, route_.norm_topk = true;
    sliding_ = archs::read_swa_pattern(m, n + hp.n_nextn, /*default_period=*/-1);  // required
    if (!m.error().empty()) return;
    for (int il = 0; il < n; ++il) {
      const int kv = kv_heads_[size_t(il)];
      if (kv <= 0 || hp.n_head % kv)
        return m.fail("attention.head_count_kv[" + std::to_string(il) +
                      "] = " + std::to_string(kv) + " does not divide the head count");
    }
    hp.n_head_kv = kv_heads_[0];
    if (window_ < 1) return m.fail("implausible mimo2.attention.sliding_window");
    fused_ = m.file().tensor("blk.0.attn_qkv.weight") != nullptr;
    for (int il = 0; il < n; ++il)
      if (!moe_[size_t(il)]) {
        n_ff_ = archs::width(m, "blk." + std::to_string(il) + ".ffn_gate.weight", 1,
                             "feed_forward_length");
        break;
      }
    if (hp.n_nextn > 0)
      n_ff_nextn_ = archs::width(m, "blk." + std::to_string(n) + ".ffn_gate.weight", 1,
                                 "feed_forward_length");
  }

  void plan(const Hparams& hp, Plan& p) override {
    hp_ = hp;
    const int64_t n_embd = hp.n_embd, n_q = archs::q_width(hp);
    layers_.resize(size_t(hp.n_blocks()));
    for (int il = 0; il < hp.n_blocks(); ++il) {
      Layer& w = layers_[size_t(il)];
      const int64_t n_k = kv(il) * hp.head_dim, n_v = kv(il) * dv_;
      p.blk(il);
      p.add(w.attn_norm, "attn_norm.weight", {n_embd}, Role::Norm);
      if (fused(il)) {
        p.add(w.wqkv, "attn_qkv.weight", {n_embd, n_q + n_k + n_v});
      } else {
        p.add(w.wq, "attn_q.weight", {n_embd, n_q});
        p.add(w.wk, "attn_k.weight", {n_embd, n_k});
        p.add(w.wv, "attn_v.weight", {n_embd, n_v});
      }
      p.add(w.wo, "attn_output.weight", {hp.n_head * dv_, n_embd}, Role::AttnOut);
      // MiMo-V2-Flash's sink bias is on its sliding-window layers (synth writes it there)
      p.optional(w.sinks, "attn_sinks.weight", {hp.n_head}, Role::Bias,
                 /*synth=*/sliding_[size_t(il)] != 0);
      if (!moe_[size_t(il)]) {
        p.add(w.ffn_norm, "ffn_norm.weight", {n_embd}, Role::Norm);
        archs::plan_ffn(p, w.ffn, hp, il < hp.n_layer ? n_ff_ : n_ff_nextn_);
        continue;
      }
      p.add(w.moe.norm, "ffn_norm.weight", {n_embd}, Role::Norm);
      w.moe.route = route_;
      p.moe(w.moe, hp);
    }
  }

  KvRows kv_rows(const Hparams& hp, int il, int) const override {
    return {kv(il) * hp.head_dim, kv(il) * dv_};
  }
  const MoeWeights* moe(int il) const override {
    return moe_[size_t(il)] ? &layers_[size_t(il)].moe : nullptr;
  }

  void block(Engine& e, int il, Act x) const override {
    Ops& ops = e.ops();
    const Layer& w = layers_[size_t(il)];
    const Hparams& hp = hp_;
    const bool sliding = sliding_[size_t(il)];
    const int64_t n_q = archs::q_width(hp), n_k = kv(il) * hp.head_dim, n_v = kv(il) * dv_;
    Act h = ops.rms_norm(x, w.attn_norm, hp.eps);
    Act q = ops.alloc(x.rows, n_q), k = ops.alloc(x.rows, n_k), v = ops.alloc(x.rows, n_v);
    if (fused(il)) {
      Act qkv = ops.matmul(w.wqkv, h);  // [q | k | v] per row
      ops.copy(q, columns(qkv, 0, n_q));
      ops.copy(k, columns(qkv, n_q, n_k));
      ops.copy(v, columns(qkv, n_q + n_k, n_v));
    } else {
      ops.matmul(w.wq, h, q), ops.matmul(w.wk, h, k), ops.matmul(w.wv, h, v);
    }
    const RopeOpts rope{sliding ? rope_base_swa_ : hp.rope_base, /*neox=*/true};
    ops.rope(q, hp.head_dim, 0, hp.n_rot, rope);
    ops.rope(k, hp.head_dim, 0, hp.n_rot, rope);
    AttnOpts a{hp.n_head, int(kv(il)), hp.head_dim, 1.0f / std::sqrt(float(hp.head_dim))};
    a.head_dim_v = dv_;
    if (sliding) a.window = window_;
    a.sinks = w.sinks;
    Act att = ops.alloc(x.rows, hp.n_head * dv_);
    ops.attention(il, q, k, v, a, att);
    Act o = ops.matmul(w.wo, att);
    if (value_scale_ != 1.0f && value_scale_ != 0.0f) {
      const std::vector<float> f(size_t(x.rows), value_scale_);
      ops.scale_rows(o, f);
    }
    ops.add(x, o);
    archs::ffn_half(e, il, x, h, moe(il), w.ffn_norm, w.ffn, hp.eps);
  }

  bool nextn_chain() const override { return true; }
  std::string nextn_alt_head_norm() const override { return "layer_output_norm.weight"; }
  Act nextn_hidden(Engine&, const Model&, Act x, Act) const override { return x; }
  Act nextn_head(Engine& e, const Model& m, const NextnWeights& w, Act x,
                 Act* next_hidden) const override {
    return archs::nextn_prenorm_head(e, m, w, x, next_hidden);
  }

  std::vector<std::string> synth_presets() const override { return {"mimo-v2"}; }
  expertd::Result<SynthModel> synth(const std::string& preset, const SynthDims& d) const override;

 private:
  int64_t kv(int il) const { return kv_heads_[size_t(il)]; }
  bool fused(int il) const { return fused_ || il >= hp_.n_layer; }  // llama.cpp: MTP fused
  struct Layer {
    Tensor attn_norm, wq, wk, wv, wqkv, wo, sinks;
    Tensor ffn_norm;  // dense layers
    FfnWeights ffn;
    MoeWeights moe;
  };
  Hparams hp_;
  RouteOpts route_;
  int window_ = 0, dv_ = 0;
  float rope_base_swa_ = 10000.0f, value_scale_ = 1.0f;
  bool fused_ = false;
  int64_t n_ff_ = 0, n_ff_nextn_ = 0;
  std::vector<int> kv_heads_;  // per block (the NextN ones included)
  std::vector<char> moe_, sliding_;
  std::vector<Layer> layers_;
};

// MiMo-V2-Flash (309B total, 15B active; Xiaomi's technical report, arXiv:2601.02780, and model
// card): 48 layers in 8 blocks of 5 sliding-window layers (windows of 128, a learnable sink bias)
// and 1 global, n_embd 4,096, 64 heads, 256 routed experts of which 8 route a token and no shared
// one, vocabulary 151,680, a 256K context, 3 MTP layers. The rest is as llama.cpp's converter
// reads the config (conversion/mimo.py: head_count_kv per layer, key/value sizes, partial
// rotary, value scale) with values not quoted above chosen so the totals come out, and marked
// assumptions: query/key heads of 192 and value heads of 128 with 64 dimensions rotated, 4 KV
// heads on global layers and 8 on sliding ones, a dense first layer of 11,008, experts of 2,048
// (256 x 3 x 4,096 x 2,048 x 47 = 303B routed, 309B in all; 8 routed, attention, the dense layer
// and embeddings = 15.2B active), rope bases 640,000 (global) and 10,000, value scale 0.707,
// RMSNorm eps 1e-5. The global layer leads each block of six.
// --dims: KV heads n_head_kv on global layers and twice as many (where they divide the heads)
// on sliding ones, windows of 8, keys of the head size and values of half.
expertd::Result<SynthModel> Mimo2::synth(const std::string&, const SynthDims& d) const {
  archs::SynthSizes s{4096, 48, 256, 8, 2048, 64, 4, 192, 151680, 640000.0f, 1e-5f, 64};
  int n_ff = 11008, window = 128, kv_swa = 8, dv = 128;
  const int nextn = 3;
  EXPERTD_TRY(archs::apply_dims(s, d));
  if (d.given()) {
    n_ff = 2 * s.n_ff_exp, window = 8, s.n_rot = s.head_dim / 2, dv = s.head_dim / 2;
    kv_swa = s.n_head % (2 * s.n_head_kv) ? s.n_head_kv : 2 * s.n_head_kv;
  }
  if (d.layers > 0) s.n_layer = std::min<int>(s.n_layer, static_cast<int>(d.layers));
  if (s.n_layer < 2)
    return expertd::make_error("synth mimo-v2: needs 2 layers (a dense one first)");
  auto m = archs::synth_base(s, "qwen2");
  if (!m) return m;
  const int n_all = s.n_layer + nextn;
  std::vector<int32_t> kv(static_cast<size_t>(n_all)), pattern(static_cast<size_t>(n_all));
  for (int il = 0; il < n_all; ++il) {
    const bool sliding = il >= s.n_layer || il % 6 != 0;  // the MTP blocks slide too
    pattern[size_t(il)] = sliding, kv[size_t(il)] = sliding ? kv_swa : s.n_head_kv;
  }
  m->u32["context_length"] = 262144;
  m->u32["block_count"] = n_all;
  m->u32["nextn_predict_layers"] = nextn;
  // The MTP blocks as llama.cpp's mimo2 graph_mtp reads them: a sliding layer's attention (as
  // their head counts say), its q, k and v fused, and the dense first layer's FFN.
  m->nextn_like = 1, m->nextn_fused_qkv = true, m->nextn_ffn_like = 0;
  m->u32.erase("attention.head_count_kv");
  m->arrays["attention.head_count_kv"] = kv;
  m->arrays["attention.sliding_window_pattern"] = pattern;
  m->u32["attention.value_length"] = dv;
  m->u32["attention.sliding_window"] = window;
  m->u32["leading_dense_block_count"] = 1;  // (read by our planner only: archs::moe_by_router)
  m->u32["feed_forward_length"] = n_ff;
  m->f32["rope.freq_base_swa"] = 10000.0f;
  m->f32["attention.value_scale"] = 0.707f;
  m->f32["expert_weights_scale"] = 1.0f;
  return m;
}

}  // namespace

std::unique_ptr<Arch> make_arch_mimo2() {
  return std::make_unique<Mimo2>();
}

}  // namespace engine
