// Qwen3-MoE (qwen3moe): GQA, per-head q/k RMSNorm, NeoX RoPE, softmax top-k with renormalised
// weights, every block an MoE block.
#include "engine/archs/common.h"
#include "engine/engine.h"

namespace engine {
namespace {

class Qwen3Moe final : public Arch {
 public:
  void read_hparams(Meta& m, Hparams& hp) override {
    archs::read_base(m, hp);
    archs::read_yarn(m, hp, /*yarn_ok=*/false);  // any rope scaling is refused
    route_ = archs::read_routing(m, hp, /*norm_default=*/true, /*sigmoid_default=*/false);
  }

  void plan(const Hparams& hp, Plan& p) override {
    hp_ = hp;
    const int64_t n_embd = hp.n_embd, head_dim = hp.head_dim;
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
      p.add(w.q_norm, "attn_q_norm.weight", {head_dim}, Role::Norm);  // per head
      p.add(w.k_norm, "attn_k_norm.weight", {head_dim}, Role::Norm);
      p.add(w.wo, "attn_output.weight", {archs::q_width(hp), n_embd}, Role::AttnOut);
      p.add(w.moe.norm, "ffn_norm.weight", {n_embd}, Role::Norm);
      w.moe.route = route_;
      p.moe(w.moe, hp);
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
    ops.rms_norm(q, w.q_norm, q, hp.eps, hp.head_dim);
    ops.rms_norm(k, w.k_norm, k, hp.eps, hp.head_dim);
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

  std::vector<std::string> synth_presets() const override { return {"qwen3-30b-a3b"}; }
  expertd::Result<SynthModel> synth(const std::string&, const SynthDims& d) const override {
    archs::SynthSizes s{2048, 48, 128, 8, 768, 32, 4, 128, 151936, 1e6f, 1e-6f};
    EXPERTD_TRY(archs::apply_dims(s, d));
    return archs::synth_base(s, "qwen2");
  }

 private:
  struct Layer {
    Tensor attn_norm, wq, wk, wv, q_norm, k_norm, wo;
    MoeWeights moe;
  };
  Hparams hp_;
  RouteOpts route_;
  std::vector<Layer> layers_;
};

}  // namespace

std::unique_ptr<Arch> make_arch_qwen3moe() {
  return std::make_unique<Qwen3Moe>();
}

}  // namespace engine
