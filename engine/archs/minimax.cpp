// MiniMax-M2 (minimax-m2): grouped-query attention with q/k RMSNorms over all the heads at once
// (one weight of n_head head_dim and of n_head_kv head_dim), partial NeoX RoPE, and routed experts
// only, sigmoid gating with the selection bias, always renormalised (llama.cpp reads no
// expert_weights_norm for it; a file that says false is refused), SwiGLU.
//
// MiniMax-M3 (minimax-m3): grouped-query attention with per-head q/k RMSNorms (one head_dim
// vector for every head) and partial NeoX RoPE, DeepSeek-V3's leading dense layers and routed
// experts beside one shared expert (sigmoid gating with the selection bias, renormalised, scaled),
// every FFN through gpt-oss's clamped SwiGLU (swiglu_oai), and MiniMax Sparse Attention (MSA) on
// the MoE layers: an indexer (q_proj over one head per KV head, k_proj to one key per position,
// each RMSNormed and rotated as the attention's heads) scores every position a token sees; per KV
// head the block of `block_size` positions scores its best position, the `local_blocks` blocks
// ending at the token's own are forced in, and the KV head's query heads attend only to the
// positions of its top_k blocks (llama.cpp selects per KV head; Ops::block_scores,
// AttnOpts::blocks). The converter bakes the +1 of the Gemma-style norms into their weights, so
// every norm is a plain RMSNorm here. llama.cpp runs MSA only with flash attention on (else the
// dense attention, with a warning); this is the sparse model. The released weights carry no MTP
// layers.
#include <cmath>

#include "engine/archs/common.h"
#include "engine/engine.h"

namespace engine {
namespace {

class MiniMax final : public Arch {
 public:
  explicit MiniMax(bool m3) : m3_(m3) {}

  void read_hparams(Meta& m, Hparams& hp) override {
    if (!m3_) return read_m2(m, hp);
    m.u("leading_dense_block_count", n_dense_lead_, 0);
    archs::read_base(m, hp, n_dense_lead_);
    if (!m.error().empty()) return;
    if (n_dense_lead_ >= hp.n_layer) return m.fail("leading_dense_block_count leaves no MoE layer");
    route_ = archs::read_routing(m, hp, /*norm_default=*/false, /*sigmoid_default=*/true);
    int n_shared = 0;
    m.u("expert_shared_count", n_shared, 0);
    if (n_shared < 1) return m.fail("minimax-m3 needs expert_shared_count (its shared expert)");
    n_ff_shexp_ =
        m.tensor_dim("blk." + std::to_string(n_dense_lead_) + ".ffn_gate_shexp.weight", 1);
    if (n_ff_shexp_ == kAnyDim) n_ff_shexp_ = hp.n_ff_exp * n_shared;
    if (n_dense_lead_ > 0)
      n_ff_ = archs::width(m, "blk.0.ffn_gate.weight", 1, "feed_forward_length");
    m.u("attention.indexer.head_count", idx_.heads);
    int dim = 0;
    m.u("attention.indexer.key_length", dim);
    idx_.dim = dim;
    m.u("attention.indexer.top_k", top_k_);
    m.u("attention.indexer.block_size", idx_.block);
    m.u("attention.indexer.local_blocks", idx_.local);
    archs::read_yarn(m, hp, /*yarn_ok=*/false);
    if (!m.error().empty()) return;
    // llama.cpp asserts one indexer head per KV head (the heads select per group)
    if (idx_.heads != hp.n_head_kv)
      return m.fail("attention.indexer.head_count (" + std::to_string(idx_.heads) +
                    ") must equal attention.head_count_kv (" + std::to_string(hp.n_head_kv) + ")");
    if (idx_.block < 1 || top_k_ < 1 || idx_.local < 0 || idx_.dim < hp.n_rot || hp.n_rot % 2)
      return m.fail("implausible attention.indexer sizes");
  }

  void plan(const Hparams& hp, Plan& p) override {
    hp_ = hp;
    const int64_t n_embd = hp.n_embd, qk_norm = m3_ ? hp.head_dim : archs::q_width(hp),
                  kv_norm = m3_ ? hp.head_dim : archs::kv_width(hp);
    layers_.resize(size_t(hp.n_layer));
    for (int il = 0; il < hp.n_layer; ++il) {
      Layer& w = layers_[size_t(il)];
      p.blk(il);
      archs::plan_gqa(p, w.a, hp);
      p.add(w.q_norm, "attn_q_norm.weight", {qk_norm}, Role::Norm);
      p.add(w.k_norm, "attn_k_norm.weight", {kv_norm}, Role::Norm);
      if (il < n_dense_lead_) {
        p.add(w.ffn_norm, "ffn_norm.weight", {n_embd}, Role::Norm);
        archs::plan_ffn(p, w.ffn, hp, n_ff_);
        w.ffn.act.kind = Activation::SwigluOai;
        continue;
      }
      p.add(w.moe.norm, "ffn_norm.weight", {n_embd}, Role::Norm);
      w.moe.route = route_;
      p.moe(w.moe, hp);
      if (!m3_) continue;  // MiniMax-M2: routed experts only, SwiGLU
      archs::plan_shared_expert(p, w.moe, hp, n_ff_shexp_, /*gated=*/false);
      w.moe.act.kind = Activation::SwigluOai;  // the routed and the shared experts
      p.add(w.ix.q_proj, "indexer.q_proj.weight", {n_embd, idx_.heads * idx_.dim});
      p.add(w.ix.k_proj, "indexer.k_proj.weight", {n_embd, idx_.dim});
      p.add(w.ix.q_norm, "indexer.q_norm.weight", {idx_.dim}, Role::Norm);
      p.add(w.ix.k_norm, "indexer.k_norm.weight", {idx_.dim}, Role::Norm);
    }
  }

  // MiniMax-M3's sparse layers' key rows carry the indexer's key after the attention's keys.
  KvRows kv_rows(const Hparams& hp, int il, int) const override {
    KvRows r = archs::gqa_rows(hp);
    if (m3_ && il >= n_dense_lead_) r.k += idx_.dim;
    return r;
  }
  const MoeWeights* moe(int il) const override {
    return il < n_dense_lead_ ? nullptr : &layers_[size_t(il)].moe;
  }

  void block(Engine& e, int il, Act x) const override {
    Ops& ops = e.ops();
    const Layer& w = layers_[size_t(il)];
    const Hparams& hp = hp_;
    const RopeOpts rope{hp.rope_base, /*neox=*/true};
    Act h = ops.rms_norm(x, w.a.attn_norm, hp.eps);
    Act q = ops.matmul(w.a.wq, h), k = ops.matmul(w.a.wk, h), v = ops.matmul(w.a.wv, h);
    ops.rms_norm(q, w.q_norm, q, hp.eps, m3_ ? hp.head_dim : 0);  // M2: over all the heads
    ops.rms_norm(k, w.k_norm, k, hp.eps, m3_ ? hp.head_dim : 0);
    ops.rope(q, hp.head_dim, 0, hp.n_rot, rope);  // n_rot < head_dim: partial rotary
    ops.rope(k, hp.head_dim, 0, hp.n_rot, rope);
    AttnOpts a{hp.n_head, hp.n_head_kv, hp.head_dim, 1.0f / std::sqrt(float(hp.head_dim))};
    if (m3_ && il >= n_dense_lead_) {  // MSA: each KV head's top_k blocks
      const Index& ix = w.ix;
      Act iq = ops.matmul(ix.q_proj, h), ik = ops.matmul(ix.k_proj, h);
      ops.rms_norm(iq, ix.q_norm, iq, hp.eps, idx_.dim);
      ops.rms_norm(ik, ix.k_norm, ik, hp.eps);
      ops.rope(iq, idx_.dim, 0, hp.n_rot, rope);
      ops.rope(ik, idx_.dim, 0, hp.n_rot, rope);
      Act scores = ops.block_scores(il, idx_, iq, ik);
      const int64_t rows = x.rows * idx_.heads;  // a row per (token, KV head)
      Act blocks = ops.alloc(x.rows, int64_t{idx_.heads} * top_k_);
      ops.top_k({scores.data, rows, scores.cols / idx_.heads}, top_k_, {blocks.data, rows, top_k_});
      a.blocks = blocks, a.block = idx_.block;
    }
    Act att = ops.alloc(x.rows, archs::q_width(hp));
    ops.attention(il, q, k, v, a, att);
    ops.add(x, ops.matmul(w.a.wo, att));
    archs::ffn_half(e, il, x, h, moe(il), w.ffn_norm, w.ffn, hp.eps);
  }

  std::vector<std::string> synth_presets() const override {
    return {m3_ ? "minimax-m3" : "minimax-m2"};
  }
  expertd::Result<SynthModel> synth(const std::string& preset, const SynthDims& d) const override;

 private:
  void read_m2(Meta& m, Hparams& hp) {
    archs::read_base(m, hp);
    route_ = archs::read_routing(m, hp, /*norm_default=*/true, /*sigmoid_default=*/true);
    archs::read_yarn(m, hp, /*yarn_ok=*/false);
    if (!m.error().empty()) return;
    // llama.cpp's minimax-m2 graph renormalises and never groups; it aborts without a gating
    // function. A file asking for anything else is refused, not run another way.
    if (!m.has("expert_gating_func"))
      return m.fail("missing metadata minimax-m2.expert_gating_func");
    if (!route_.norm_topk)
      return m.fail(
          "minimax-m2.expert_weights_norm is false, but llama.cpp always renormalises "
          "MiniMax-M2's expert weights");
    if (route_.n_group > 0)
      return m.fail("minimax-m2.expert_group_count: llama.cpp does not group MiniMax-M2's experts");
  }
  expertd::Result<SynthModel> synth_m2(const SynthDims& d) const;

  struct Index {
    Tensor q_proj, k_proj, q_norm, k_norm;
  };
  struct Layer {
    archs::GqaWeights a;
    Tensor q_norm, k_norm;
    Tensor ffn_norm;  // dense layers
    FfnWeights ffn;
    MoeWeights moe;
    Index ix;  // MoE (sparse) layers
  };
  bool m3_;
  Hparams hp_;
  RouteOpts route_;
  BlockIndexOpts idx_;
  int top_k_ = 0, n_dense_lead_ = 0;
  int64_t n_ff_ = 0, n_ff_shexp_ = 0;
  std::vector<Layer> layers_;
};

// MiniMax-M3 (428B, 23B active: llama.cpp's LLM_TYPE_428B_A23B for its 60 layers), as
// MiniMaxAI/MiniMax-M3's config (transformers' MiniMaxM3 text config and the converter,
// llama.cpp conversion/minimax.py) publishes it: n_embd 6,144, 60 layers of which the first 3
// (moe_layer_freq) are dense of 12,288, 64 heads and 4 KV heads of 128, a rotary half (64) of
// each head (NeoX), per-head q/k norms, 128 routed experts of 3,072 (top-4, sigmoid with the
// routing bias, renormalised, routed_scaling_factor 2.0) and one shared expert of 3,072, rope
// base 5,000,000, RMSNorm eps 1e-6, a 1,048,576 context, the minimax-m2 pre-tokenizer over
// 200,064 tokens; MSA (sparse_attention_config) on the 57 MoE layers: 4 index heads of 128, the
// top 16 blocks of 128 positions, 1 local block.
// --dims scales it to a test size with every feature: a dense lead layer, the shared expert,
// half of each head rotated, and blocks of 4 positions picking 4 (one local), so that a 40-token
// prompt attends sparsely from its 17th token.
expertd::Result<SynthModel> MiniMax::synth(const std::string&, const SynthDims& d) const {
  if (!m3_) return synth_m2(d);
  archs::SynthSizes s{6144, 60, 128, 4, 3072, 64, 4, 128, 200064, 5e6f, 1e-6f, 64};
  int n_ff = 12288, dense = 3, top_k = 16, block = 128, local = 1;
  EXPERTD_TRY(archs::apply_dims(s, d));
  if (d.given()) s.n_rot = s.head_dim / 2, n_ff = 2 * s.n_ff_exp, dense = 1, top_k = 4, block = 4;
  if (d.layers > 0) s.n_layer = std::min<int>(s.n_layer, static_cast<int>(d.layers));
  dense = std::min(dense, s.n_layer - 1);
  auto m = archs::synth_base(s, "minimax-m2");
  if (!m) return m;
  m->u32["context_length"] = 1048576;
  m->u32["leading_dense_block_count"] = std::max(dense, 0);
  m->u32["feed_forward_length"] = n_ff;
  m->u32["expert_shared_count"] = 1;
  m->u32["expert_gating_func"] = 2;  // sigmoid
  m->flags["expert_weights_norm"] = true;
  m->f32["expert_weights_scale"] = 2.0f;
  m->u32["attention.indexer.head_count"] = s.n_head_kv;
  m->u32["attention.indexer.key_length"] = s.head_dim;
  m->u32["attention.indexer.top_k"] = top_k;
  m->u32["attention.indexer.block_size"] = block;
  m->u32["attention.indexer.local_blocks"] = local;
  m->specials = {"]~!b[", "]~b]", "[e~[", "<mm:think>", "</mm:think>", "]<]minimax[>["};
  return m;
}

// MiniMax-M2 (230B, 10B active: llama.cpp's LLM_TYPE_230B_A10B for its 62 layers), as
// MiniMaxAI/MiniMax-M2's config.json (transformers' MiniMaxM2Config) publishes it: n_embd 3,072,
// 62 layers, 48 heads and 8 KV heads of 128, rotary_dim 64 (NeoX), q/k norms over all heads
// (qk_norm_type per_layer), 256 experts of 1,536 (top-8, sigmoid scoring with the routing bias),
// rope base 5,000,000, RMSNorm eps 1e-6, a 196,608 context; the minimax-m2 pre-tokenizer over
// 200,064 tokens. 256 x 3 x 3,072 x 1,536 x 62 = 224B routed parameters.
// --dims: half of each head rotated.
expertd::Result<SynthModel> MiniMax::synth_m2(const SynthDims& d) const {
  archs::SynthSizes s{3072, 62, 256, 8, 1536, 48, 8, 128, 200064, 5e6f, 1e-6f, 64};
  EXPERTD_TRY(archs::apply_dims(s, d));
  if (d.given()) s.n_rot = s.head_dim / 2;
  if (d.layers > 0) s.n_layer = std::min<int>(s.n_layer, static_cast<int>(d.layers));
  auto m = archs::synth_base(s, "minimax-m2");
  if (!m) return m;
  m->u32["context_length"] = 196608;
  m->u32["expert_gating_func"] = 2;  // sigmoid
  m->specials = {"]~!b[",
                 "]~b]",
                 "[e~[",
                 "<think>",
                 "</think>",
                 "<minimax:tool_call>",
                 "</minimax:tool_call>"};
  return m;
}

}  // namespace

std::unique_ptr<Arch> make_arch_minimax_m2() {
  return std::make_unique<MiniMax>(/*m3=*/false);
}
std::unique_ptr<Arch> make_arch_minimax_m3() {
  return std::make_unique<MiniMax>(/*m3=*/true);
}

}  // namespace engine
