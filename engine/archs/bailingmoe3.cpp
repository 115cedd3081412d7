// Ling 3.0 (bailingmoe3: inclusionAI's Ling-3.0-tiny and -flash): hybrid layers as Kimi-K3's,
// Kimi Delta Attention where attention.head_count_kv is 0 (short causal convolutions on q/k/v,
// a full-rank decay gate lower_bound * sigmoid(exp(A_log) (f_a x + dt_bias)) with exp(A_log) as
// the file stores it, a full-rank sigmoid output gate) and multi-head latent attention with
// RoPE (DeepSeek-V2's, adjacent pairs) and a sigmoid gate per head from the block's input
// elsewhere; leading dense layers, then sigmoid routing with the selection bias (in expert
// groups where the file says) beside a shared expert, the SwiGLUs clamped per layer where the
// file says (swiglu_clamp_exp on the routed experts, swiglu_clamp_shexp on the shared expert
// and the dense layers, as llama.cpp's FFN reads it). The trailing NextN block (a latent-attention
// MoE block, its final norm layer_output_norm) runs to draft (Engine::set_nextn); the
// vision files' multi-section RoPE and rope scaling are refused.
#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/archs/common.h"
#include "engine/engine.h"

namespace engine {
namespace {

class BailingMoe3 final : public Arch {
 public:
  void read_hparams(Meta& m, Hparams& hp) override {
    int first_moe = 0;
    const int n_all = archs::read_trunk_by_router(m, hp, moe_, &first_moe), n = hp.n_layer;
    if (!n_all) return;
    // The NextN block drafts (llama.cpp's graph_mtp: a latent-attention MoE block), where the
    // file has it.
    if (n_all > n &&
        m.tensor_dim("blk." + std::to_string(n) + ".nextn.eh_proj.weight", 0) != kAnyDim) {
      hp.n_nextn = n_all - n;
      moe_ = archs::moe_by_router(m, n_all);
    }
    m.per_layer("attention.head_count_kv", n_all, kv_heads_);
    m.u("attention.q_lora_rank", q_lora_, 0);
    m.u("attention.kv_lora_rank", kv_lora_);
    m.u("attention.key_length_mla", k_mla_);
    m.u("attention.value_length_mla", v_mla_);
    m.u("ssm.conv_kernel", d_conv_);
    m.u("kda.head_dim", kda_head_dim_);
    if (!m.has("kda.gate_lower_bound")) m.fail("missing metadata bailingmoe3.kda.gate_lower_bound");
    m.f("kda.gate_lower_bound", lower_bound_, 0.0f);
    bool safe = true;
    m.b("kda.safe_gate", safe, true);
    route_ = archs::read_routing(m, hp, /*norm_default=*/false, /*sigmoid_default=*/false);
    if (!m.has("expert_gating_func")) m.fail("missing metadata bailingmoe3.expert_gating_func");
    int n_ff_shexp = 0, n_shared = 0;
    m.u("expert_shared_feed_forward_length", n_ff_shexp, 0);
    m.u("expert_shared_count", n_shared);
    archs::read_yarn(m, hp, /*yarn_ok=*/false);
    if (!m.error().empty()) return;
    if (m.has("rope.dimension_sections"))
      return m.fail(
          "multi-section RoPE (rope.dimension_sections: the vision files) is not "
          "supported");
    if (!safe) return m.fail("kda.safe_gate is false: only the bounded KDA gate is supported");
    if (!(lower_bound_ < 0.0f)) return m.fail("kda.gate_lower_bound must be negative");
    clamp_exp_ = archs::per_layer_floats(m, "swiglu_clamp_exp", n_all);
    clamp_shexp_ = archs::per_layer_floats(m, "swiglu_clamp_shexp", n_all);
    n_ff_shexp_ = m.tensor_dim("blk." + std::to_string(first_moe) + ".ffn_gate_shexp.weight", 1);
    if (n_ff_shexp_ == kAnyDim) n_ff_shexp_ = n_ff_shexp;
    if (n_ff_shexp_ <= 0) n_ff_shexp_ = hp.n_ff_exp * std::max(1, n_shared);  // llama.cpp's
    for (int il = 0; il < n; ++il)
      if (!moe_[size_t(il)]) {
        n_ff_ = archs::width(m, "blk." + std::to_string(il) + ".ffn_gate.weight", 1,
                             "feed_forward_length");
        break;
      }
    // MLA is served as MQA: one latent "KV head" of kv_lora + n_rot floats.
    for (int il = 0; il < n; ++il)
      if (kv_heads_[size_t(il)] > 1)
        return m.fail("attention.head_count_kv[" + std::to_string(il) +
                      "] = " + std::to_string(kv_heads_[size_t(il)]) +
                      ": a Ling 3.0 layer is KDA (0) or latent attention (1)");
    hp.n_head_kv = 1;
    if (hp.n_head <= 0) return m.fail("attention.head_count is 0");
    if (hp.head_dim != kv_lora_ + hp.n_rot || k_mla_ <= hp.n_rot || v_mla_ <= 0 || kv_lora_ <= 0)
      return m.fail("inconsistent multi-head latent attention sizes (key_length " +
                    std::to_string(hp.head_dim) +
                    " should be kv_lora_rank + rope.dimension_count)");
    if (hp.n_rot % 2) return m.fail("rope.dimension_count must be even");
    if (kda_head_dim_ <= 0 || kda_head_dim_ > 256) return m.fail("implausible kda.head_dim");
    if (d_conv_ < 1 || d_conv_ > 64) return m.fail("implausible ssm.conv_kernel");
    if (!route_.sigmoid) return m.fail("expert_gating_func: Ling 3.0 routes with a sigmoid (2)");
  }

  void plan(const Hparams& hp, Plan& p) override {
    hp_ = hp;
    const int64_t E = hp.n_embd, H = hp.n_head, S = kda_head_dim_, D = H * S;
    const int64_t n_rot = hp.n_rot, qk_nope = k_mla_ - n_rot;
    layers_.resize(size_t(hp.n_blocks()));
    for (int il = 0; il < hp.n_blocks(); ++il) {
      Layer& w = layers_[size_t(il)];
      p.blk(il);
      p.add(w.attn_norm, "attn_norm.weight", {E}, Role::Norm);
      w.kda = kv_heads_[size_t(il)] == 0;
      if (w.kda) {
        DeltaOpts& o = w.kda_opts;
        o = DeltaOpts::kda(static_cast<int>(H), S, d_conv_);
        o.lower_bound = lower_bound_, o.a_positive = true, o.eps = hp.eps;
        // depthwise filters, stored {d_conv, 1, channels}; F32 (ggml's ssm_conv)
        p.add(o.conv_q, "ssm_conv1d_q.weight", {d_conv_, 1, D}, Role::Bias);
        p.add(o.conv_k, "ssm_conv1d_k.weight", {d_conv_, 1, D}, Role::Bias);
        p.add(o.conv_v, "ssm_conv1d_v.weight", {d_conv_, 1, D}, Role::Bias);
        p.add(w.wq, "attn_q.weight", {E, D});
        p.add(w.wk, "attn_k.weight", {E, D});
        p.add(w.wv, "attn_v.weight", {E, D});
        p.add(w.f_a, "ssm_f_a.weight", {E, D});  // the decay gate, full rank
        p.add(w.beta, "ssm_beta.weight", {E, H});
        p.add(o.a, "ssm_a", {1, H}, Role::Bias);  // exp(A_log)
        p.add(w.dt_b, "ssm_dt.bias", {D}, Role::Bias);
        p.add(w.g, "ssm_g_a.weight", {E, D});  // the output gate
        p.add(w.o_norm, "ssm_norm.weight", {S}, Role::Norm);
        p.add(w.wo, "attn_output.weight", {D, E}, Role::AttnOut);
      } else {
        archs::plan_mla(p, w.mla, E, q_lora_, H * k_mla_, kv_lora_, n_rot);
        p.add(w.wk_b, "attn_k_b.weight", {qk_nope, kv_lora_, H});
        p.add(w.wv_b, "attn_v_b.weight", {kv_lora_, v_mla_, H});
        p.add(w.gate, "attn_gate.weight", {E, H});  // one per head
        p.add(w.wo, "attn_output.weight", {H * v_mla_, E}, Role::AttnOut);
      }
      const float lim_sh = clamp_shexp_[size_t(il)];
      const Glu shexp_act =
          lim_sh > 1e-6f ? Glu{Activation::SwigluClamp, 1.0f, 0.0f, lim_sh} : Glu{};
      if (!moe_[size_t(il)]) {
        p.add(w.ffn_norm, "ffn_norm.weight", {E}, Role::Norm);
        archs::plan_ffn(p, w.ffn, hp, n_ff_);
        w.ffn.act = shexp_act;  // llama.cpp clamps every gated FFN by swiglu_clamp_shexp
        continue;
      }
      p.add(w.moe.norm, "ffn_norm.weight", {E}, Role::Norm);
      w.moe.route = route_;
      if (clamp_exp_[size_t(il)] > 1e-6f)
        w.moe.act = {Activation::SwigluClamp, 1.0f, 0.0f, clamp_exp_[size_t(il)]};
      w.moe.shexp_act = shexp_act;
      p.moe(w.moe, hp);
      archs::plan_shared_expert(p, w.moe, hp, n_ff_shexp_, /*gated=*/false);
    }
  }

  KvRows kv_rows(const Hparams& hp, int il, int) const override {
    if (kv_heads_[size_t(il)] == 0)
      return {0, 0, DeltaOpts::kda(hp.n_head, kda_head_dim_, d_conv_).state_floats()};
    return {kv_lora_ + hp.n_rot, 0};
  }
  const MoeWeights* moe(int il) const override {
    return moe_[size_t(il)] ? &layers_[size_t(il)].moe : nullptr;
  }

  void block(Engine& e, int il, Act x) const override {
    Ops& ops = e.ops();
    const Layer& w = layers_[size_t(il)];
    Act h = ops.rms_norm(x, w.attn_norm, hp_.eps);
    ops.add(x, w.kda ? kda(e, il, w, h) : mla(e, il, w, h));
    archs::ffn_half(e, il, x, h, moe(il), w.ffn_norm, w.ffn, hp_.eps);
  }

  std::string nextn_head_norm() const override { return "layer_output_norm.weight"; }

  std::vector<std::string> synth_presets() const override { return {"ling-3.0-flash"}; }
  expertd::Result<SynthModel> synth(const std::string& preset, const SynthDims& d) const override;

 private:
  struct Layer {
    Tensor attn_norm, ffn_norm;
    bool kda = false;
    DeltaOpts kda_opts;  // KDA
    Tensor wq, wk, wv, f_a, beta, dt_b, g, o_norm;
    archs::MlaProjections mla;  // MLA
    Tensor wk_b, wv_b, gate;
    Tensor wo;
    FfnWeights ffn;  // leading dense layers
    MoeWeights moe;
  };

  Act kda(Engine& e, int il, const Layer& w, Act h) const {
    Ops& ops = e.ops();
    Act q = ops.matmul(w.wq, h), k = ops.matmul(w.wk, h), v = ops.matmul(w.wv, h);
    Act g = ops.matmul(w.f_a, h);
    ops.add_bias(g, w.dt_b);
    Act beta = ops.matmul(w.beta, h);
    Act o = ops.alloc(h.rows, q.cols);
    ops.delta_rule(il, w.kda_opts, q, k, v, g, beta, o);
    ops.rms_norm(o, w.o_norm, o, hp_.eps, w.kda_opts.dv);
    ops.mul_act(o, ops.matmul(w.g, h), Unary::Sigmoid);
    return ops.matmul(w.wo, o);
  }

  Act mla(Engine& e, int il, const Layer& w, Act h) const {
    Ops& ops = e.ops();
    const archs::MlaQkv qkv = archs::mla_project(ops, w.mla, h, kv_lora_, hp_.eps);
    const int64_t n_rot = hp_.n_rot;
    const RopeOpts rope{hp_.rope_base, /*neox=*/false};
    ops.rope(qkv.kv, kv_lora_ + n_rot, kv_lora_, n_rot, rope);
    ops.rope(qkv.q, k_mla_, k_mla_ - n_rot, n_rot, rope);
    const MlaOpts o{hp_.n_head,     kv_lora_, n_rot,
                    k_mla_ - n_rot, v_mla_,   1.0f / std::sqrt(float(k_mla_))};
    Act att = ops.alloc(h.rows, int64_t{hp_.n_head} * v_mla_);
    ops.attention_mla(il, qkv.q, qkv.kv, w.wk_b, w.wv_b, o, att);
    ops.mul_act(att, ops.matmul(w.gate, h), Unary::Sigmoid);  // one per head
    return ops.matmul(w.wo, att);
  }

  Hparams hp_;
  RouteOpts route_;
  std::vector<char> moe_;
  std::vector<int> kv_heads_;  // per block (the NextN ones included)
  std::vector<float> clamp_exp_, clamp_shexp_;
  int q_lora_ = 0, kv_lora_ = 0, k_mla_ = 0, v_mla_ = 0, d_conv_ = 0, kda_head_dim_ = 0;
  float lower_bound_ = 0.0f;
  int64_t n_ff_ = 0, n_ff_shexp_ = 0;
  std::vector<Layer> layers_;
};

// Ling-3.0-flash (124B total, 5.1B active), each fact from its source:
// - 42 blocks, n_embd 2,560, 512 routed experts: llama.cpp's bailingmoe3 loader, which names
//   that shape LLM_TYPE_124B_A5_1B ("Ling-3.0-flash"); one NextN block (llama.cpp's converter
//   exports it, and Ling-3.0-flash MTP GGUFs are run with --spec-type draft-mtp).
// - The layer schedule: KDA except every layer_group_size-th (4) and the tail after the last
//   whole group, which are latent attention (llama.cpp's converter, is_full_attention), so 12 of
//   42 here.
// - From Ling-3.0-tiny's published config.json (the one of the family found; the structure is
//   shared): KDA heads of 128 with a conv kernel of 4 and the -5 gate bound, MLA qk_nope 128,
//   rope 64, v_head 128, kv_lora 512, q_lora 256, the dense FFN 3 x n_embd, one shared expert
//   as wide as a routed one, 8 expert groups of which 4 are used, sigmoid routing renormalised
//   and scaled by 2.5, rope base 6,000,000, RMSNorm eps 1e-6, vocabulary 157,184.
// - Derived, not published: 24 heads, experts 768 wide, top-10 and 2 leading dense layers. They
//   are a solution of the two published totals with the rest above: 123.5B in all, 5.11B
//   active (embeddings both ways, attention, the dense layers, 10 routed and the shared expert).
// --dims: latent ranks n_embd / 2, heads of n_embd / n_head for both attentions, half of each
// latent head rotated, one dense lead layer, groups where the experts divide, and SwiGLU clamps
// on every MoE layer and the dense one (the test sizes exercise them; the preset has none).
expertd::Result<SynthModel> BailingMoe3::synth(const std::string&, const SynthDims& d) const {
  archs::SynthSizes s{2560, 42, 512, 10, 768, 24, 1, 128, 157184, 6000000.0f, 1e-6f, 64};
  int kda_head = 128, kv_lora = 512, q_lora = 256, qk_nope = 128, rope = 64, v_head = 128,
      n_ff = 3 * 2560, dense = 2, groups = 8, groups_used = 4, nextn = 1;
  float clamp = 0.0f, clamp_sh = 0.0f;
  EXPERTD_TRY(archs::apply_dims(s, d));
  if (d.given()) {
    kda_head = s.head_dim, kv_lora = s.n_embd / 2, q_lora = s.n_embd / 2, qk_nope = s.head_dim,
    rope = std::max(2, s.head_dim / 2), v_head = s.head_dim, n_ff = 2 * s.n_ff_exp, dense = 1;
    groups = s.n_expert % 4 ? 1 : 4, groups_used = groups > 1 ? 2 : 1, clamp = 2.0f,
    clamp_sh = 1.5f;
  }
  s.n_head_kv = 1;
  if (d.layers > 0) s.n_layer = std::min<int>(s.n_layer, static_cast<int>(d.layers));
  dense = std::min(dense, s.n_layer - 1);
  auto m = archs::synth_base(s, "bailingmoe2");
  if (!m) return m;
  const int n_all = s.n_layer + nextn, group = 4;
  std::vector<int32_t> kv(static_cast<size_t>(n_all));
  std::vector<float> lim(size_t(n_all), 0.0f), lim_sh(size_t(n_all), 0.0f);
  for (int il = 0; il < n_all; ++il) {
    kv[size_t(il)] = il >= s.n_layer || (il + 1) % group == 0 || il >= s.n_layer / group * group;
    lim[size_t(il)] = il >= dense ? clamp : 0.0f, lim_sh[size_t(il)] = clamp_sh;
  }
  m->u32["block_count"] = uint32_t(n_all);
  m->u32["nextn_predict_layers"] = uint32_t(nextn);
  m->nextn_like = s.n_layer - 1;  // latent attention and MoE, as the NextN block
  m->nextn_out_norm = "layer_output_norm.weight";
  m->u32.erase("attention.head_count_kv");
  m->arrays["attention.head_count_kv"] = kv;
  m->u32["context_length"] = 131072;
  m->u32["leading_dense_block_count"] = uint32_t(std::max(dense, 0));
  m->u32["feed_forward_length"] = uint32_t(n_ff);
  m->u32["expert_feed_forward_length"] = uint32_t(s.n_ff_exp);
  m->u32["expert_shared_count"] = 1;
  m->u32["expert_shared_feed_forward_length"] = uint32_t(s.n_ff_exp);
  m->u32["expert_gating_func"] = 2;  // sigmoid
  m->flags["expert_weights_norm"] = true;
  m->f32["expert_weights_scale"] = 2.5f;
  m->u32["expert_group_count"] = uint32_t(groups);
  m->u32["expert_group_used_count"] = uint32_t(groups_used);
  archs::synth_mla(*m, {q_lora, kv_lora, qk_nope, rope, v_head});
  m->u32["ssm.conv_kernel"] = 4;
  m->u32["kda.head_dim"] = uint32_t(kda_head);
  m->flags["kda.safe_gate"] = true;
  m->f32["kda.gate_lower_bound"] = -5.0f;
  if (clamp > 0.0f) {
    m->farrays["swiglu_clamp_exp"] = lim;
    m->farrays["swiglu_clamp_shexp"] = lim_sh;
  }
  m->u32["vocab_size"] = uint32_t(s.n_vocab);
  return m;
}

}  // namespace

std::unique_ptr<Arch> make_arch_bailingmoe3() {
  return std::make_unique<BailingMoe3>();
}

}  // namespace engine
