// OpenAI gpt-oss (gpt-oss): attention sinks, a sliding window on every other layer, YaRN RoPE,
// biases on every projection (experts too), top-k of the raw router logits then a softmax over
// those k, a clamped SwiGLU (alpha 1.702, limit 7), MXFP4 experts.
#include "engine/archs/common.h"
#include "engine/engine.h"

namespace engine {
namespace {

class GptOss final : public Arch {
 public:
  void read_hparams(Meta& m, Hparams& hp) override {
    archs::read_base(m, hp);
    m.u("attention.sliding_window", window_);
    route_ = archs::read_routing(m, hp, /*norm_default=*/false, /*sigmoid_default=*/false);
    route_.topk_then_softmax = true;
    yarn_ = archs::read_yarn(m, hp, /*yarn_ok=*/true);
  }

  void plan(const Hparams& hp, Plan& p) override {
    hp_ = hp;
    const int64_t n_embd = hp.n_embd, n_q = archs::q_width(hp), n_kv = archs::kv_width(hp);
    layers_.resize(hp.n_layer);
    for (int il = 0; il < hp.n_layer; ++il) {
      Layer& w = layers_[il];
      p.blk(il);
      p.add(w.attn_norm, "attn_norm.weight", {n_embd}, Role::Norm);
      p.add(w.wq, "attn_q.weight", {n_embd, n_q});
      p.add(w.wk, "attn_k.weight", {n_embd, n_kv});
      p.add(w.wv, "attn_v.weight", {n_embd, n_kv});
      p.add(w.bq, "attn_q.bias", {n_q}, Role::Bias);
      p.add(w.bk, "attn_k.bias", {n_kv}, Role::Bias);
      p.add(w.bv, "attn_v.bias", {n_kv}, Role::Bias);
      // one extra softmax logit per head
      p.add(w.sinks, "attn_sinks.weight", {hp.n_head}, Role::Bias);
      p.add(w.wo, "attn_output.weight", {n_q, n_embd}, Role::AttnOut);
      p.add(w.bo, "attn_output.bias", {n_embd}, Role::Bias);
      p.add(w.moe.norm, "post_attention_norm.weight", {n_embd}, Role::Norm);
      w.moe.route = route_;
      p.moe(w.moe, hp, /*expert_biases=*/true);
      w.moe.act.kind = Activation::SwigluOai;
    }
  }

  KvRows kv_rows(const Hparams& hp, int, int) const override { return archs::gqa_rows(hp); }
  const MoeWeights* moe(int il) const override { return &layers_[il].moe; }

  void block(Engine& e, int il, Act x) const override {
    Ops& ops = e.ops();
    const Layer& w = layers_[il];
    const Hparams& hp = hp_;
    const RopeOpts rope{hp.rope_base, /*neox=*/true, yarn_ ? &*yarn_ : nullptr};
    Act h = ops.rms_norm(x, w.attn_norm, hp.eps);
    Act q = ops.matmul(w.wq, h), k = ops.matmul(w.wk, h), v = ops.matmul(w.wv, h);
    ops.add_bias(q, w.bq);
    ops.add_bias(k, w.bk);
    ops.add_bias(v, w.bv);
    ops.rope(q, hp.head_dim, 0, hp.n_rot, rope);
    ops.rope(k, hp.head_dim, 0, hp.n_rot, rope);
    AttnOpts a{hp.n_head, hp.n_head_kv, hp.head_dim, 1.0f / std::sqrt(float(hp.head_dim))};
    a.window = il % 2 == 0 ? window_ : 0;  // even layers: sliding window; odd: full attention
    a.sinks = w.sinks;
    Act att = ops.alloc(x.rows, archs::q_width(hp));
    ops.attention(il, q, k, v, a, att);
    Act o = ops.matmul(w.wo, att);
    ops.add_bias(o, w.bo);
    ops.add(x, o);
    ops.rms_norm(x, w.moe.norm, h, hp.eps);
    ops.add(x, e.moe(il, w.moe, h));
  }

 private:
  struct Layer {
    Tensor attn_norm, wq, wk, wv, bq, bk, bv, sinks, wo, bo;
    MoeWeights moe;
  };
  Hparams hp_;
  RouteOpts route_;
  int window_ = 0;
  std::optional<kernels::Yarn> yarn_;
  std::vector<Layer> layers_;
};

}  // namespace

std::unique_ptr<Arch> make_arch_gpt_oss() {
  return std::make_unique<GptOss>();
}

}  // namespace engine
