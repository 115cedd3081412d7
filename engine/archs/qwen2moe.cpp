// Qwen1.5/Qwen2-MoE (qwen2moe): q/k/v biases, NeoX RoPE, softmax top-k without renormalisation,
// a shared expert gated by sigmoid(ffn_gate_inp_shexp . x), every block an MoE block.
#include "engine/archs/common.h"
#include "engine/engine.h"

namespace engine {
namespace {

class Qwen2Moe final : public Arch {
 public:
  void read_hparams(Meta& m, Hparams& hp) override {
    archs::read_base(m, hp);
    n_ff_shexp_ =
        archs::width(m, "blk.0.ffn_gate_shexp.weight", 1, "expert_shared_feed_forward_length");
    archs::read_yarn(m, hp, /*yarn_ok=*/false);  // any rope scaling is refused
    route_ = archs::read_routing(m, hp, /*norm_default=*/false, /*sigmoid_default=*/false);
  }

  void plan(const Hparams& hp, Plan& p) override {
    hp_ = hp;
    const int64_t n_embd = hp.n_embd;
    layers_.resize(hp.n_layer);
    for (int il = 0; il < hp.n_layer; ++il) {
      Layer& w = layers_[il];
      p.blk(il);
      p.add(w.attn_norm, "attn_norm.weight", {n_embd}, Role::Norm);
      // (n_embd) -> (n_head * head_dim)
      p.add(w.wq, "attn_q.weight", {n_embd, archs::q_width(hp)});
      // (n_embd) -> (n_head_kv * head_dim)
      p.add(w.wk, "attn_k.weight", {n_embd, archs::kv_width(hp)});
      p.add(w.wv, "attn_v.weight", {n_embd, archs::kv_width(hp)});
      p.add(w.bq, "attn_q.bias", {archs::q_width(hp)}, Role::Bias);
      p.add(w.bk, "attn_k.bias", {archs::kv_width(hp)}, Role::Bias);
      p.add(w.bv, "attn_v.bias", {archs::kv_width(hp)}, Role::Bias);
      p.add(w.wo, "attn_output.weight", {archs::q_width(hp), n_embd}, Role::AttnOut);
      p.add(w.moe.norm, "ffn_norm.weight", {n_embd}, Role::Norm);
      w.moe.route = route_;
      p.moe(w.moe, hp);
      archs::plan_shared_expert(p, w.moe, hp, n_ff_shexp_, /*gated=*/true);
    }
  }

  KvRows kv_rows(const Hparams& hp, int, int) const override { return archs::gqa_rows(hp); }
  const MoeWeights* moe(int il) const override { return &layers_[il].moe; }

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
    ops.rope(q, hp.head_dim, 0, hp.n_rot, rope);
    ops.rope(k, hp.head_dim, 0, hp.n_rot, rope);
    Act att = ops.alloc(x.rows, archs::q_width(hp));
    ops.attention(il, q, k, v,
                  {hp.n_head, hp.n_head_kv, hp.head_dim, 1.0f / std::sqrt(float(hp.head_dim))},
                  att);
    ops.add(x, ops.matmul(w.wo, att));
    ops.rms_norm(x, w.moe.norm, h, hp.eps);
    ops.add(x, e.moe(il, w.moe, h));
  }

 private:
  struct Layer {
    Tensor attn_norm, wq, wk, wv, bq, bk, bv, wo;
    MoeWeights moe;
  };
  Hparams hp_;
  RouteOpts route_;
  int64_t n_ff_shexp_ = 0;
  std::vector<Layer> layers_;
};

}  // namespace

std::unique_ptr<Arch> make_arch_qwen2moe() {
  return std::make_unique<Qwen2Moe>();
}

}  // namespace engine
