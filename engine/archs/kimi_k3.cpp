// Kimi-K3 (kimi-k3): hybrid layers, Kimi Delta Attention (KDA: short causal convolutions on
// q/k/v, a per-head delta-rule state decayed per key dimension, a full-rank output gate) where
// attention.head_count_kv is 0 and nope-only multi-head latent attention with a sigmoid output
// gate elsewhere; cross-layer attention residuals (every attn_res.block_size-th layer banks its
// input, each sub-layer reads a softmax mix of the banked rows and the running sum); latent MoE
// (routed experts at expert_latent_length, between ffn_routed_down and ffn_routed_up, the router
// and the shared expert at full width); the situ activation everywhere; sigmoid routing with a
// selection bias, leading dense layers.
#include <algorithm>
#include <cmath>

#include "engine/archs/common.h"
#include "engine/engine.h"

namespace engine {
namespace {

class KimiK3 final : public Arch {
 public:
  void read_hparams(Meta& m, Hparams& hp) override {
    m.u("embedding_length", hp.n_embd);
    m.u("block_count", hp.n_layer);
    m.per_layer("attention.head_count", hp.n_layer, heads_);
    m.per_layer("attention.head_count_kv", hp.n_layer, kv_heads_);
    m.u("attention.key_length", hp.head_dim);
    m.u("rope.dimension_count", hp.n_rot);
    m.u("expert_count", hp.n_expert);
    m.u("expert_used_count", hp.n_expert_used);
    m.u("context_length", hp.n_ctx_train, 4096);
    m.f("attention.layer_norm_rms_epsilon", hp.eps, 1e-6f);
    m.u("leading_dense_block_count", n_dense_lead_, 0);
    m.u("attention.q_lora_rank", q_lora_, 0);
    m.u("attention.kv_lora_rank", kv_lora_);
    m.u("attention.key_length_mla", k_mla_);
    m.u("attention.value_length_mla", v_mla_);
    m.u("ssm.conv_kernel", d_conv_);
    m.u("kda.head_dim", kda_head_dim_);
    m.f("kda.gate_lower_bound", lower_bound_, -INFINITY);
    m.u("expert_shared_count", n_shared_);
    m.u("expert_latent_length", latent_, 0);
    m.u("attn_res.block_size", res_bs_);
    if (!m.has("activation.situ_beta")) m.fail("missing metadata kimi-k3.activation.situ_beta");
    if (!m.has("activation.situ_linear_beta"))
      m.fail("missing metadata kimi-k3.activation.situ_linear_beta");
    m.f("activation.situ_beta", situ_.beta, 1.0f);
    m.f("activation.situ_linear_beta", situ_.linear_beta, 0.0f);
    situ_.kind = Activation::Situ;
    if (!m.has("expert_gating_func")) m.fail("missing metadata kimi-k3.expert_gating_func");
    route_ = archs::read_routing(m, hp, /*norm_default=*/false, /*sigmoid_default=*/true);
    if (!m.error().empty()) return;
    hp.n_ff_exp = m.tensor_dim("blk." + std::to_string(n_dense_lead_) + ".ffn_gate_exps.weight", 1);
    if (hp.n_ff_exp == kAnyDim) {  // a core GGUF
      int ff = 0;
      m.u("expert_feed_forward_length", ff);
      hp.n_ff_exp = ff;
    }
    if (n_dense_lead_ > 0)
      n_ff_ = archs::width(m, "blk.0.ffn_gate.weight", 1, "feed_forward_length");
    if (!m.error().empty()) return;

    // MLA is served as MQA: one latent "KV head" of kv_lora + n_rot floats.
    hp.n_head_kv = 1;
    hp.n_head = 0;
    for (int il = 0; il < hp.n_layer; ++il) {
      if (kv_heads_[il] > 1)
        return m.fail("attention.head_count_kv[" + std::to_string(il) +
                      "] = " + std::to_string(kv_heads_[il]) +
                      ": a Kimi-K3 layer is KDA (0) or latent attention (1)");
      if (heads_[il] <= 0 && kv_heads_[il] == 1)
        return m.fail("attention.head_count[" + std::to_string(il) + "] is 0");
      if (hp.n_head == 0 && heads_[il] > 0) hp.n_head = heads_[il];
    }
    for (int il = 0; il < hp.n_layer; ++il)
      if (heads_[il] == 0) heads_[il] = hp.n_head;  // llama.cpp: KDA layers take the model's
    if (hp.head_dim != kv_lora_ + hp.n_rot || k_mla_ <= hp.n_rot || v_mla_ <= 0 || kv_lora_ <= 0)
      return m.fail("inconsistent multi-head latent attention sizes (key_length " +
                    std::to_string(hp.head_dim) +
                    " should be kv_lora_rank + rope.dimension_count)");
    if (kda_head_dim_ <= 0 || kda_head_dim_ > 1024) return m.fail("implausible kda.head_dim");
    if (d_conv_ < 1 || d_conv_ > 64) return m.fail("implausible ssm.conv_kernel");
    if (n_dense_lead_ > hp.n_layer) return m.fail("leading_dense_block_count exceeds block_count");
    if (!(situ_.beta > 0.0f)) return m.fail("activation.situ_beta must be positive");
    if (!route_.sigmoid) return m.fail("expert_gating_func: Kimi-K3 routes with a sigmoid (2)");
    if (res_bs_ > 0 && checkpoints(hp.n_layer) > kMaxCheckpoints)
      return m.fail("attn_res.block_size " + std::to_string(res_bs_) + " banks " +
                    std::to_string(checkpoints(hp.n_layer)) + " residual rows; at most " +
                    std::to_string(kMaxCheckpoints) + " are supported");
  }

  void plan(const Hparams& hp, Plan& p) override {
    hp_ = hp;
    const int64_t E = hp.n_embd, S = kda_head_dim_, n_rot = hp.n_rot, qk_nope = k_mla_ - n_rot;
    const int64_t latent = latent_ > 0 ? latent_ : E;
    if (res_bs_ > 0) p.add(output_res_, "output_res_score.weight", {E}, Role::Bias);
    layers_.resize(hp.n_layer);
    for (int il = 0; il < hp.n_layer; ++il) {
      Layer& w = layers_[il];
      const int64_t H = heads_[il], D = H * S;
      p.blk(il);
      p.add(w.attn_norm, "attn_norm.weight", {E}, Role::Norm);
      p.add(w.ffn_norm, "ffn_norm.weight", {E}, Role::Norm);
      if (res_bs_ > 0) {
        p.add(w.attn_res, "attn_res_score.weight", {E}, Role::Bias);
        p.add(w.ffn_res, "ffn_res_score.weight", {E}, Role::Bias);
      }
      w.kda = kv_heads_[il] == 0;
      if (w.kda) {
        DeltaOpts& o = w.kda_opts;
        o = DeltaOpts::kda(static_cast<int>(H), S, d_conv_);
        o.lower_bound = lower_bound_, o.eps = hp.eps;
        // depthwise filters, stored {d_conv, 1, channels}; F32 (ggml's ssm_conv)
        p.add(o.conv_q, "ssm_conv1d_q.weight", {d_conv_, 1, D}, Role::Bias);
        p.add(o.conv_k, "ssm_conv1d_k.weight", {d_conv_, 1, D}, Role::Bias);
        p.add(o.conv_v, "ssm_conv1d_v.weight", {d_conv_, 1, D}, Role::Bias);
        p.add(w.wq, "attn_q.weight", {E, D});
        p.add(w.wk, "attn_k.weight", {E, D});
        p.add(w.wv, "attn_v.weight", {E, D});
        p.add(w.f_a, "ssm_f_a.weight", {E, S});  // the decay gate: (E) -> (S) -> (D)
        p.add(w.f_b, "ssm_f_b.weight", {S, D});
        p.add(w.beta, "ssm_beta.weight", {E, H});
        p.add(o.a, "ssm_a", {H}, Role::Bias);  // -exp(A_log)
        p.add(w.dt_b, "ssm_dt.bias", {D}, Role::Bias);
        p.add(w.g, "ssm_g.weight", {E, D});  // the output gate
        p.add(w.o_norm, "ssm_norm.weight", {S}, Role::Norm);
        p.add(w.wo, "attn_output.weight", {D, E}, Role::AttnOut);
      } else {
        archs::plan_mla(p, w.mla, E, q_lora_, H * k_mla_, kv_lora_, n_rot);
        p.add(w.wk_b, "attn_k_b.weight", {qk_nope, kv_lora_, H});
        p.add(w.wv_b, "attn_v_b.weight", {kv_lora_, v_mla_, H});
        p.optional(w.gate, "attn_gate.weight", {E, H * v_mla_}, Role::Weight, /*synth=*/true);
        p.add(w.wo, "attn_output.weight", {H * v_mla_, E}, Role::AttnOut);
      }
      if (il < n_dense_lead_) {
        archs::plan_ffn(p, w.ffn, hp, n_ff_);
        w.ffn.act = situ_;
        continue;
      }
      w.moe.norm = w.ffn_norm;
      w.moe.route = route_;
      w.moe.act = situ_;
      w.moe.n_embd = latent;
      p.moe(w.moe, hp);
      if (latent_ > 0) {
        p.add(w.routed_down, "ffn_routed_down.weight", {E, latent});
        p.add(w.routed_up, "ffn_routed_up.weight", {latent, E});
        p.optional(w.routed_norm, "ffn_routed_norm.weight", {latent}, Role::Norm, /*synth=*/true);
      }
      if (n_shared_ > 0) {
        const int64_t F = hp.n_ff_exp * n_shared_;
        p.add(w.shexp.gate, "ffn_gate_shexp.weight", {E, F});
        p.add(w.shexp.up, "ffn_up_shexp.weight", {E, F});
        p.add(w.shexp.down, "ffn_down_shexp.weight", {F, E});
        w.shexp.act = situ_;
      }
    }
  }

  KvRows kv_rows(const Hparams& hp, int il, int) const override {
    if (kv_heads_[il] == 0)
      return {0, 0, DeltaOpts::kda(heads_[il], kda_head_dim_, d_conv_).state_floats()};
    return {kv_lora_ + hp.n_rot, 0};
  }
  const MoeWeights* moe(int il) const override {
    return il < n_dense_lead_ ? nullptr : &layers_[il].moe;
  }

  // The banked rows: checkpoints(n_layer) blocks of T rows.
  void begin_eval(Engine& e, Act, Act x) const override {
    if (res_bs_ > 0) e.carried() = {e.ops().alloc(checkpoints(hp_.n_layer) * x.rows, x.cols)};
  }
  Act end_eval(Engine& e, Act x) const override {
    if (res_bs_ == 0) return x;
    Ops& ops = e.ops();
    Act mixed = ops.alloc(x.rows, x.cols);
    ops.res_mix(e.carried()[0], checkpoints(hp_.n_layer), x, output_res_, hp_.eps, mixed);
    return mixed;
  }

  void block(Engine& e, int il, Act x) const override {
    Ops& ops = e.ops();
    const Layer& w = layers_[il];
    const Hparams& hp = hp_;
    const int64_t T = x.rows, E = x.cols;
    // x is the running sum; each sub-layer reads it mixed with the rows banked so far.
    Act stack = res_bs_ > 0 ? e.carried()[0] : Act{};
    int n = res_bs_ > 0 ? checkpoints(il) : 0;
    auto mixed = [&](const Tensor& score) {
      if (n == 0) return x;
      Act y = ops.alloc(T, E);
      ops.res_mix(stack, n, x, score, hp.eps, y);
      return y;
    };
    Act h = ops.rms_norm(mixed(w.attn_res), w.attn_norm, hp.eps);
    const bool banked = res_bs_ > 0 && il % res_bs_ == 0;
    if (banked) ops.copy(Act{stack.data + n * T * E, T, E}, x), ++n;  // the raw layer input
    Act a = w.kda ? kda(e, il, w, h) : mla(e, il, w, h);
    if (banked)
      ops.copy(x, a);  // the running sum restarts from the attention output
    else
      ops.add(x, a);
    ops.rms_norm(mixed(w.ffn_res), w.ffn_norm, h, hp.eps);
    if (il < n_dense_lead_) {
      Act y = ops.alloc(T, E);
      ops.ffn(w.ffn, h, y);
      ops.add(x, y);
      return;
    }
    Act xl = w.routed_down ? ops.matmul(w.routed_down, h) : h;
    Act y = e.moe(il, w.moe, h, xl);
    if (w.routed_norm) ops.rms_norm(y, w.routed_norm, y, hp.eps);
    if (w.routed_up) y = ops.matmul(w.routed_up, y);
    if (w.shexp.gate) {
      Act s = ops.alloc(T, E);
      ops.ffn(w.shexp, h, s);
      ops.add(y, s);
    }
    ops.add(x, y);
  }

  std::vector<std::string> synth_presets() const override { return {"kimi-k3"}; }
  // Kimi-K3's shapes, each from its source:
  // - 93 blocks, 92 of them routed MoE (one dense lead block); 896 routed experts per layer,
  //   top-16, 2 shared experts; the latent MoE 7,168 -> 3,584 (82,432 routed experts in all):
  //   the public descriptions of the model (colibri's docs/kimi_k3.md) and the SGLang SSD-pack
  //   write-up (92 routed layers, top-16, Q2_K gate/up and Q3_K down, 1,009.51 GB in 38 shards).
  // - The routed experts' width 3,072 is derived, not published: it is the width at which 82,432
  //   Q2_K/Q3_K experts of 3,584 x 3,072 (11.96 MB each) make the write-up's 1,009.51 GB beside
  //   the rest of the model. The shared experts are 2 x 3,072 wide at n_embd (as llama.cpp's
  //   kimi-k3 shapes ffn_*_shexp: the expert width times the shared count).
  // - n_embd 7,168, 64 heads, MLA ranks (q 1,536, kv 512, nope 128, rope 64, v 128), the dense
  //   FFN 18,432 and the 163,840-token vocabulary: no source gives K3's; they are Kimi-K2's
  //   (its published config.json), the lineage K3 keeps, as before.
  // - KDA head 128, the -5 gate bound, attention residual blocks of 3, situ betas: llama.cpp's
  //   kimi-k3 defaults (no published config either).
  expertd::Result<SynthModel> synth(const std::string&, const SynthDims& d) const override {
    archs::SynthSizes s{7168, 93, 896, 16, 3072, 64, 1, 112, 163840};
    int kda_head = 128, kv_lora = 512, q_lora = 1536, qk_nope = 128, rope = 64, v_head = 128,
        latent = 3584, n_ff = 18432, res_bs = 3;
    EXPERTD_TRY(archs::apply_dims(s, d));
    if (d.given())
      kda_head = s.head_dim, kv_lora = s.n_embd / 2, q_lora = s.n_embd / 2, qk_nope = s.head_dim,
      rope = std::max(2, s.head_dim / 2), v_head = s.head_dim, latent = s.n_embd / 2,
      n_ff = 2 * s.n_ff_exp, res_bs = 2;
    s.n_head_kv = 1;
    auto m = archs::synth_base(s, "kimi-k2");
    if (!m) return m;
    m->u32.erase("attention.head_count_kv");
    m->u32.erase("attention.value_length");
    // KDA layers (head_count_kv 0) three in four, full attention every fourth and last (as
    // Kimi-Linear's full_attn_layers), the last of the depth --layers cuts to.
    if (d.layers > 0) s.n_layer = std::min<int>(s.n_layer, static_cast<int>(d.layers));
    std::vector<int32_t> kv(s.n_layer);
    for (int il = 0; il < s.n_layer; ++il) kv[il] = (il + 1) % 4 == 0 || il == s.n_layer - 1;
    m->arrays["attention.head_count_kv"] = kv;
    m->u32["leading_dense_block_count"] = 1;
    m->u32["expert_shared_count"] = 2;
    m->u32["feed_forward_length"] = n_ff;
    archs::synth_mla(*m, {q_lora, kv_lora, qk_nope, rope, v_head});
    m->u32["ssm.conv_kernel"] = 4;
    m->u32["kda.head_dim"] = kda_head;
    m->f32["kda.gate_lower_bound"] = -5.0f;
    m->u32["expert_latent_length"] = latent;
    m->u32["expert_gating_func"] = 2;
    m->flags["expert_weights_norm"] = true;
    m->f32["expert_weights_scale"] = 2.5f;
    m->u32["attn_res.block_size"] = res_bs;
    m->f32["activation.situ_beta"] = 4.0f;
    m->f32["activation.situ_linear_beta"] = 16.0f;
    m->f32["attention.layer_norm_rms_epsilon"] = 1e-5f;
    m->u32["vocab_size"] = s.n_vocab;
    m->specials = {"[BOS]", "[EOS]", "<|open|>", "<|sep|>", "<|close|>", "<|end_of_msg|>"};
    return m;
  }

 private:
  static constexpr int kMaxCheckpoints = 64;

  struct Layer {
    Tensor attn_norm, ffn_norm, attn_res, ffn_res;
    bool kda = false;
    // KDA
    DeltaOpts kda_opts;  // the delta rule as KDA runs it
    Tensor wq, wk, wv, f_a, f_b, beta, dt_b, g, o_norm;
    // MLA
    archs::MlaProjections mla;
    Tensor wk_b, wv_b, gate;
    Tensor wo;
    FfnWeights ffn;  // leading dense layers
    MoeWeights moe;
    Tensor routed_down, routed_up, routed_norm;
    FfnWeights shexp;
  };

  // Rows banked by the layers before `il` (every res_bs-th layer banks one).
  int checkpoints(int il) const { return (il + res_bs_ - 1) / res_bs_; }

  Act kda(Engine& e, int il, const Layer& w, Act h) const {
    Ops& ops = e.ops();
    Act q = ops.matmul(w.wq, h), k = ops.matmul(w.wk, h), v = ops.matmul(w.wv, h);
    Act g = ops.matmul(w.f_b, ops.matmul(w.f_a, h));
    ops.add_bias(g, w.dt_b);
    Act beta = ops.matmul(w.beta, h);
    Act o = ops.alloc(h.rows, q.cols);
    ops.delta_rule(il, w.kda_opts, q, k, v, g, beta, o);
    ops.rms_norm(o, w.o_norm, o, hp_.eps, w.kda_opts.dv);
    ops.mul_act(o, ops.matmul(w.g, h), Unary::Sigmoid);
    return ops.matmul(w.wo, o);
  }

  // Nope-only: the rotary parts of the latent rows and queries stay as projected.
  Act mla(Engine& e, int il, const Layer& w, Act h) const {
    Ops& ops = e.ops();
    const archs::MlaQkv proj = archs::mla_project(ops, w.mla, h, kv_lora_, hp_.eps);
    const Act q = proj.q, kv = proj.kv;
    const MlaOpts o{heads_[il],         kv_lora_, hp_.n_rot,
                    k_mla_ - hp_.n_rot, v_mla_,   1.0f / std::sqrt(float(k_mla_))};
    Act att = ops.alloc(h.rows, int64_t{heads_[il]} * v_mla_);
    ops.attention_mla(il, q, kv, w.wk_b, w.wv_b, o, att);
    if (w.gate) ops.mul_act(att, ops.matmul(w.gate, h), Unary::Sigmoid);
    return ops.matmul(w.wo, att);
  }

  Hparams hp_;
  RouteOpts route_;
  Glu situ_;
  std::vector<int> heads_, kv_heads_;
  int n_dense_lead_ = 0, q_lora_ = 0, kv_lora_ = 0, k_mla_ = 0, v_mla_ = 0, d_conv_ = 0,
      kda_head_dim_ = 0, n_shared_ = 0, latent_ = 0, res_bs_ = 0;
  float lower_bound_ = -INFINITY;
  int64_t n_ff_ = 0;
  Tensor output_res_;
  std::vector<Layer> layers_;
};

}  // namespace

std::unique_ptr<Arch> make_arch_kimi_k3() {
  return std::make_unique<KimiK3>();
}

}  // namespace engine
