// DeepSeek-V3.2 (deepseek32) and GLM-5 (glm-dsa): DeepSeek-V3's multi-head latent attention made
// sparse by DeepSeek Sparse Attention (DSA). Per layer a lightning indexer scores every earlier
// position: its query from the q LoRA rows (indexer.attn_q_b), one key per position
// (indexer.attn_k, a LayerNorm with bias), both rotated on their first n_rot dims (DeepSeek-V3.2:
// NeoX pairs, GLM-5: adjacent pairs) then by the Walsh-Hadamard matrix as llama.cpp caches them,
// and per-head weights (indexer.proj) scaled by 1 / sqrt(dim heads); the score is
// sum_h relu(q_h . k) w_h, and each token attends to its top_k positions only (all of them while
// it sees no more than top_k). The rest is deepseek2's (engine/archs/deepseek2.h): leading dense
// layers, sigmoid routing with the selection bias, groups, a shared expert. GLM-5.2's "shared"
// indexer layers (attention.indexer.types 0) reuse the previous full layer's selection.
// The multi-token-prediction block (nextn_predict_layers) drafts (Engine::set_nextn): dense
// latent attention over its own rows, no indexer (llama.cpp's graph_mtp).
#include <cmath>

#include "engine/archs/deepseek2.h"

namespace engine {
namespace {

class Dsa final : public archs::Deepseek2 {
 public:
  explicit Dsa(bool glm) : glm_(glm) {
    // llama.cpp: glm-dsa defaults to sigmoid gating and never reads YaRN's log multiplier
    sigmoid_default_ = glm, yarn_ok_ = !glm, glm_lite_default_ = false;
  }

  // Deepseek2's, which leaves the trailing multi-token-prediction blocks out of the trunk, and
  // the indexer's.
  void read_hparams(Meta& m, Hparams& hp) override {
    int n_all = 0;
    m.u("block_count", n_all);
    Deepseek2::read_hparams(m, hp);
    m.u("attention.indexer.head_count", idx_.heads);
    int dim = 0;
    m.u("attention.indexer.key_length", dim);
    idx_.dim = dim;
    m.u("attention.indexer.top_k", top_k_);
    if (!m.error().empty()) return;
    if (q_lora_ <= 0)
      return m.fail(std::string("the lightning indexer needs ") +
                    (glm_ ? "glm-dsa" : "deepseek32") + ".attention.q_lora_rank");
    if (idx_.heads < 1 || top_k_ < 1 || idx_.dim < hp.n_rot)
      return m.fail("implausible attention.indexer sizes");
    // llama.cpp rotates the indexer's rows by Walsh-Hadamard blocks of the largest power of two
    // of 64 or more that divides them; rows of another size would be rotated across heads.
    if (idx_.dim % 64) return m.fail("attention.indexer.key_length must be a multiple of 64");
    rot_ = 64;
    while (idx_.dim % (2 * rot_) == 0) rot_ *= 2;
    idx_.scale = 1.0f / std::sqrt(float(idx_.dim * idx_.heads));
    // GLM-5.2's pattern: 1 = the layer runs its indexer, 0 = it reuses the previous one's
    // selection. llama.cpp's default: every layer full before GLM-5.2's 1M context, else
    // GLM-5.2's published pattern (full, full, then one full in four).
    full_.assign(size_t(hp.n_layer), 1);
    if (glm_) {
      const std::string key = "glm-dsa.attention.indexer.types";
      if (auto types = m.file().get_number_array(key)) {  // the trunk's layers, or all of them
        if (types->size() != size_t(hp.n_layer) && types->size() != size_t(n_all))
          return m.fail(key + " has " + std::to_string(types->size()) + " values for " +
                        std::to_string(hp.n_layer) + " layers");
        for (int il = 0; il < hp.n_layer; ++il) full_[size_t(il)] = (*types)[size_t(il)] != 0;
      } else if (hp.n_ctx_train >= 1048576) {
        for (int il = 2; il < hp.n_layer; ++il) full_[size_t(il)] = (il - 2) % 4 == 0;
      }
      if (hp.n_layer > 0 && !full_[0])
        return m.fail("attention.indexer.types: the first layer must run its indexer");
    }
    full_.resize(size_t(n_all), 0);  // the NextN blocks: dense, no indexer
  }

  void plan(const Hparams& hp, Plan& p) override {
    Deepseek2::plan(hp, p);
    index_.resize(size_t(hp.n_layer));
    for (int il = 0; il < hp.n_layer; ++il) {
      if (!full_[size_t(il)]) continue;
      Index& x = index_[size_t(il)];
      p.blk(il);
      p.add(x.k_norm, "indexer.k_norm.weight", {idx_.dim}, Role::Norm);
      p.add(x.k_norm_b, "indexer.k_norm.bias", {idx_.dim}, Role::Bias);
      p.add(x.proj, "indexer.proj.weight", {hp.n_embd, idx_.heads});
      p.add(x.attn_k, "indexer.attn_k.weight", {hp.n_embd, idx_.dim});
      p.add(x.q_b, "indexer.attn_q_b.weight", {q_lora_, idx_.heads * idx_.dim});
    }
  }

  // The latent row (keys), and the indexer's key as the value row of the layers that run one.
  KvRows kv_rows(const Hparams& hp, int il, int) const override {
    return {kv_lora_ + hp.n_rot, il < hp.n_layer && full_[size_t(il)] ? idx_.dim : 0};
  }

  // The selection, carried from a full indexer layer to the shared ones after it.
  void begin_eval(Engine& e, Act, Act x) const override {
    e.carried() = {e.ops().alloc(x.rows, top_k_)};
  }

  void block(Engine& e, int il, Act x) const override {
    Ops& ops = e.ops();
    const Layer& w = layers_[size_t(il)];
    const int64_t D = idx_.dim, n_rot = hp_.n_rot;
    Act h = ops.rms_norm(x, w.attn_norm, hp_.eps);
    const archs::MlaQkv qkv = archs::mla_project(ops, w.mla, h, kv_lora_, hp_.eps);
    Act sel = il < hp_.n_layer ? e.carried()[0] : Act{};  // NextN: dense
    if (full_[size_t(il)]) {
      const Index& ix = index_[size_t(il)];
      const RopeOpts rope{hp_.rope_base, /*neox=*/!glm_, yarn_ ? &*yarn_ : nullptr};
      Act q = ops.matmul(ix.q_b, qkv.qa), k = ops.matmul(ix.attn_k, h);
      // llama.cpp: DeepSeek-V3.2's LayerNorm epsilon is 1e-6; glm-dsa leaves it unset (0)
      ops.layer_norm(k, ix.k_norm, ix.k_norm_b, k, glm_ ? 0.0f : 1e-6f);
      ops.rope(q, D, 0, n_rot, rope);  // the head's layout is [rotated | not]
      ops.rope(k, D, 0, n_rot, rope);
      ops.hadamard(q, rot_);
      ops.hadamard(k, rot_);
      Act scores = ops.index_scores(il, idx_, q, k, ops.matmul(ix.proj, h));
      ops.top_k(scores, top_k_, sel);
    }
    ops.add(x, attend(ops, il, qkv, sel));
    ffn_part(e, il, x, h);
  }

  std::vector<std::string> synth_presets() const override {
    return {glm_ ? "glm-5" : "deepseek-v3.2"};
  }
  expertd::Result<SynthModel> synth(const std::string& preset, const SynthDims& d) const override;

 private:
  struct Index {
    Tensor k_norm, k_norm_b, proj, attn_k, q_b;
  };
  bool glm_;
  IndexOpts idx_;
  int top_k_ = 0;
  int64_t rot_ = 64;        // the Walsh-Hadamard blocks of the indexer's rows
  std::vector<char> full_;  // per layer: runs its indexer (else reuses the previous selection)
  std::vector<Index> index_;
};

// DeepSeek-V3.2 (685B, 37B active): DeepSeek-V3's shapes with DSA, as deepseek-ai/DeepSeek-V3.2's
// config.json publishes them: n_embd 7,168, 61 layers (3 dense of 18,432), 128 heads, q/kv LoRA
// 1,536/512, nope/rope/v 128/64/128, 256 routed experts of 2,048 (top-8 in 4 of 8 groups,
// sigmoid, renormalised, scale 2.5), one shared expert, YaRN 40x 4,096 (mscale_all_dim 1: the
// converter's log multiplier 0.1), a 163,840 context, one MTP layer, and an indexer of 64 heads
// of 128 picking 2,048; the deepseek-v3 vocabulary of 129,280.
// GLM-5 (744B, 40B active): zai-org/GLM-5's config.json: n_embd 6,144, 78 layers (3 dense of
// 12,288), 64 heads, q/kv LoRA 2,048/512, nope/rope/v 192/64/256, 256 routed experts of 2,048
// (top-8, sigmoid, renormalised, scale 2.5, no groups), one shared expert, rope base 1,000,000,
// a 202,752 context, one MTP layer, an indexer of 32 heads of 128 picking 2,048; the glm4
// pre-tokenizer over 154,880 tokens.
// --dims scales either to a test size with every feature: the MLA sizes from n_embd and the
// head size, the indexer's 4 heads of 64 picking 8 (so that a 40-token prompt selects), YaRN
// (DeepSeek-V3.2), groups where the experts divide into them, the MTP layer.
expertd::Result<SynthModel> Dsa::synth(const std::string&, const SynthDims& d) const {
  archs::SynthSizes s = glm_ ? archs::SynthSizes{6144, 78, 256, 8, 2048, 64, 64, 256, 154880}
                             : archs::SynthSizes{7168, 61, 256, 8, 2048, 128, 128, 192, 129280};
  int q_lora = glm_ ? 2048 : 1536, kv_lora = 512, qk_nope = glm_ ? 192 : 128, rope = 64,
      v_head = glm_ ? 256 : 128, n_ff = glm_ ? 12288 : 18432, dense = 3, groups = glm_ ? 1 : 8,
      groups_used = glm_ ? 1 : 4, idx_heads = glm_ ? 32 : 64, idx_dim = 128, top_k = 2048;
  if (glm_) s.rope_base = 1000000.0f, s.eps = 1e-5f;
  EXPERTD_TRY(archs::apply_dims(s, d));
  if (d.given()) {
    q_lora = s.n_embd / 2, kv_lora = s.n_embd, qk_nope = s.head_dim, rope = s.head_dim / 2,
    v_head = s.head_dim, n_ff = 2 * s.n_ff_exp, dense = 1, idx_heads = 4, idx_dim = 64, top_k = 8;
    groups = glm_ || s.n_expert % 4 ? 1 : 4, groups_used = groups > 1 ? 2 : 1;
    if (kv_lora + rope == idx_dim) idx_dim = 128;  // llama.cpp rotates equal-sized latent keys
  }
  if (d.layers > 0) s.n_layer = std::min<int>(s.n_layer, static_cast<int>(d.layers));
  dense = std::min(dense, s.n_layer - 1);
  auto m = archs::synth_base(s, glm_ ? "glm4" : "deepseek-v3");
  if (!m) return m;
  m->u32["attention.head_count_kv"] = 1;
  m->u32["leading_dense_block_count"] = std::max(dense, 0);
  m->u32["expert_shared_count"] = 1;
  m->u32["feed_forward_length"] = n_ff;
  archs::synth_mla(*m, {q_lora, kv_lora, qk_nope, rope, v_head});
  m->u32["attention.indexer.head_count"] = idx_heads;
  m->u32["attention.indexer.key_length"] = idx_dim;
  m->u32["attention.indexer.top_k"] = top_k;
  m->u32["expert_gating_func"] = 2;  // sigmoid
  m->flags["expert_weights_norm"] = true;
  m->f32["expert_weights_scale"] = 2.5f;
  m->u32["expert_group_count"] = groups;
  m->u32["expert_group_used_count"] = groups_used;
  // the published MTP layer, after the trunk (written by expert-pack synth, run by neither engine)
  m->u32["block_count"] += 1;
  m->u32["nextn_predict_layers"] = 1;
  m->u32["context_length"] = glm_ ? 202752 : 163840;
  if (!glm_) {
    m->strings["rope.scaling.type"] = "yarn";
    m->f32["rope.scaling.factor"] = d.given() ? 4.0f : 40.0f;
    m->u32["rope.scaling.original_context_length"] = d.given() ? 64 : 4096;
    m->f32["rope.scaling.yarn_log_multiplier"] = 0.1f;
    m->f32["rope.scaling.yarn_beta_fast"] = 32.0f;
    m->f32["rope.scaling.yarn_beta_slow"] = 1.0f;
    m->specials = {"<｜begin▁of▁sentence｜>",
                   "<｜end▁of▁sentence｜>",
                   "<｜User｜>",
                   "<｜Assistant｜>",
                   "<think>",
                   "</think>"};
  } else {
    m->specials = glm_specials();
  }
  return m;
}

}  // namespace

std::unique_ptr<Arch> make_arch_deepseek32() {
  return std::make_unique<Dsa>(/*glm=*/false);
}
std::unique_ptr<Arch> make_arch_glm_dsa() {
  return std::make_unique<Dsa>(/*glm=*/true);
}

}  // namespace engine
