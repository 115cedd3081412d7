// Mixtral-style llama with experts (llama + expert_count): adjacent-pair RoPE, softmax top-k
// with renormalisation, every block an MoE block.
#include "engine/archs/common.h"
#include "engine/engine.h"

namespace engine {
namespace {

class LlamaMoe final : public Arch {
 public:
  void read_hparams(Meta& m, Hparams& hp) override {
    archs::read_base(m, hp);
    archs::read_yarn(m, hp, /*yarn_ok=*/false);  // any rope scaling is refused
    route_ = archs::read_routing(m, hp, /*norm_default=*/true, /*sigmoid_default=*/false);
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
    const RopeOpts rope{hp.rope_base, /*neox=*/false};
    Act h = ops.rms_norm(x, w.attn_norm, hp.eps);
    Act q = ops.matmul(w.wq, h), k = ops.matmul(w.wk, h), v = ops.matmul(w.wv, h);
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

  std::vector<std::string> synth_presets() const override { return {"mixtral-8x7b"}; }
  expertd::Result<SynthModel> synth(const std::string&, const SynthDims& d) const override {
    archs::SynthSizes s{4096, 32, 8, 2, 14336, 32, 8, 128, 32000, 1e6f, 1e-5f};
    EXPERTD_TRY(archs::apply_dims(s, d));
    return archs::synth_base(s, "llama-bpe");
  }

 private:
  struct Layer {
    Tensor attn_norm, wq, wk, wv, wo;
    MoeWeights moe;
  };
  Hparams hp_;
  RouteOpts route_;
  std::vector<Layer> layers_;
};

}  // namespace

std::unique_ptr<Arch> make_arch_llama() {
  return std::make_unique<LlamaMoe>();
}

}  // namespace engine
