// Llama 4 (llama4: Scout 17B-16E, Maverick 17B-128E): Llama attention (whole heads rotated,
// adjacent pairs) with three layers in four chunked (a token sees its own chunk of 8,192
// positions) and every fourth global with no position encoding and, instead, the attention
// temperature on its queries; on the rotated layers the queries and keys RMS-normalised per head
// without a weight, except in the 128-expert model (llama.cpp's rule); MoE every
// interleave_moe_layer_step-th layer (dense FFNs between), the experts of a token (one in the
// published models) chosen by a sigmoid router whose weight scales the expert's input rather than
// its output, beside a shared expert. rope_freqs (Scout's llama3 rope scaling) divide the rotated
// layers' angles where the file has them. A file without chunks (sliding_window 0, MobileLLM-style)
// is refused.
#include <cmath>

#include "engine/archs/common.h"
#include "engine/engine.h"

namespace engine {
namespace {

class Llama4 final : public Arch {
 public:
  void read_hparams(Meta& m, Hparams& hp) override {
    m.u("interleave_moe_layer_step", step_);
    if (!m.error().empty()) return;
    if (step_ < 1) return m.fail("implausible llama4.interleave_moe_layer_step");
    archs::read_base(m, hp, step_ - 1);  // the first MoE layer has the experts' width
    if (step_ > 1) n_ff_ = archs::width(m, "blk.0.ffn_gate.weight", 1, "feed_forward_length");
    route_ = archs::read_routing(m, hp, /*norm_default=*/false, /*sigmoid_default=*/true);
    archs::read_yarn(m, hp, /*yarn_ok=*/false);
    if (!m.error().empty()) return;
    // llama.cpp routes Llama 4 by sigmoid, unnormalised, whatever the file says
    route_.sigmoid = true, route_.norm_topk = false, route_.n_group = 0;
    route_.weight_before = true;
    if (hp.n_rot != hp.head_dim)
      return m.fail("rope.dimension_count must be the head size (llama.cpp rotates whole heads)");
    rope_freqs_.read(m);            // Scout: llama3-style rope scaling
    kq_norm_ = hp.n_expert != 128;  // llama.cpp: every Llama 4 but the 17B-128E
    if (m.file().tensor("blk." + std::to_string(step_ - 1) + ".exp_probs_b.bias"))
      return m.fail("exp_probs_b.bias: llama.cpp's Llama 4 routing has no selection bias");
    int window = -1;
    m.u("attention.sliding_window", window, -1);
    if (window == 0)  // MobileLLM-style: no chunks, no temperature (llama.cpp's would assert)
      return m.fail("llama4.attention.sliding_window = 0: a Llama 4 without chunked attention");
    float base_swa = hp.rope_base;
    m.f("rope.freq_base_swa", base_swa, hp.rope_base);
    rope_base_swa_ = base_swa;
    chunked_ = archs::read_swa_pattern(m, hp.n_layer, 4);
  }

  void plan(const Hparams& hp, Plan& p) override {
    hp_ = hp;
    const int64_t n_embd = hp.n_embd;
    rope_freqs_.plan(p, hp.n_rot);
    layers_.resize(size_t(hp.n_layer));
    for (int il = 0; il < hp.n_layer; ++il) {
      Layer& w = layers_[size_t(il)];
      p.blk(il);
      archs::plan_gqa(p, w.a, hp);
      if (!is_moe(il)) {
        p.add(w.ffn_norm, "ffn_norm.weight", {n_embd}, Role::Norm);
        archs::plan_ffn(p, w.ffn, hp, n_ff_);
        continue;
      }
      p.add(w.moe.norm, "ffn_norm.weight", {n_embd}, Role::Norm);
      w.moe.route = RouteOpts{};  // planned as softmax-routed: no selection bias in the file
      p.moe(w.moe, hp);
      w.moe.route = route_;
      archs::plan_shared_expert(p, w.moe, hp, hp.n_ff_exp, /*gated=*/false);
    }
  }

  KvRows kv_rows(const Hparams& hp, int, int) const override { return archs::gqa_rows(hp); }
  const MoeWeights* moe(int il) const override {
    return is_moe(il) ? &layers_[size_t(il)].moe : nullptr;
  }

  void block(Engine& e, int il, Act x) const override {
    Ops& ops = e.ops();
    const Layer& w = layers_[size_t(il)];
    const Hparams& hp = hp_;
    // llama.cpp's n_no_rope_layer_step (4): every fourth layer unrotated
    const bool rope = (il + 1) % 4 != 0, chunked = chunked_[size_t(il)];
    Act h = ops.rms_norm(x, w.a.attn_norm, hp.eps);
    Act q = ops.matmul(w.a.wq, h), k = ops.matmul(w.a.wk, h), v = ops.matmul(w.a.wv, h);
    if (rope) {
      RopeOpts ro{chunked ? rope_base_swa_ : hp.rope_base, /*neox=*/false};
      ro.freq_factors = rope_freqs_.t;
      ops.rope(q, hp.head_dim, 0, hp.n_rot, ro);
      ops.rope(k, hp.head_dim, 0, hp.n_rot, ro);
      if (kq_norm_) {  // Llama4TextL2Norm: an RMS norm per head, no weight
        ops.rms_norm(q, Tensor{}, q, hp.eps, hp.head_dim);
        ops.rms_norm(k, Tensor{}, k, hp.eps, hp.head_dim);
      }
    } else {
      ops.attn_temperature(q, kTemp);  // the unrotated layers' queries
    }
    AttnOpts a{hp.n_head, hp.n_head_kv, hp.head_dim, 1.0f / std::sqrt(float(hp.head_dim))};
    if (chunked) a.chunk = kChunk;
    Act att = ops.alloc(x.rows, archs::q_width(hp));
    ops.attention(il, q, k, v, a, att);
    ops.add(x, ops.matmul(w.a.wo, att));
    // the routed expert (input weighted) plus the shared one, or the dense FFN
    archs::ffn_half(e, il, x, h, moe(il), w.ffn_norm, w.ffn, hp.eps);
  }

  std::vector<std::string> synth_presets() const override { return {"llama-4-maverick"}; }
  expertd::Result<SynthModel> synth(const std::string& preset, const SynthDims& d) const override;

 private:
  // llama.cpp's fixed chunk and temperature tuning (floor 8,192, scale 0.1, offset 1)
  static constexpr int kChunk = 8192;
  static constexpr AttnTemp kTemp{0.1f, 1.0f, 8192};
  bool is_moe(int il) const { return (il + 1) % step_ == 0; }
  struct Layer {
    archs::GqaWeights a;
    Tensor ffn_norm;  // dense layers
    FfnWeights ffn;
    MoeWeights moe;
  };
  Hparams hp_;
  RouteOpts route_;
  int step_ = 1;
  bool kq_norm_ = true;
  float rope_base_swa_ = 10000.0f;
  archs::RopeFreqs rope_freqs_;
  int64_t n_ff_ = 0;
  std::vector<char> chunked_;  // per layer: chunked attention (else global)
  std::vector<Layer> layers_;
};

// Llama-4-Maverick-17B-128E, meta-llama's config.json (text_config): n_embd 5,120, 48 layers,
// 40 heads and 8 KV heads of 128, MoE every 2nd layer (interleave_moe_layer_step 2) with 128
// experts of 8,192, top-1, and a shared expert of 8,192, dense FFNs of 16,384
// (intermediate_size_mlp) between, rope base 500,000 with no scaling, RMSNorm eps 1e-5, no QK
// norm, chunks of 8,192, a 1,048,576 context, vocabulary 202,048 (the llama4 pre-tokenizer).
// They give the published 400B total (24 x 128 x 3 x 5,120 x 8,192 = 387B routed) and 17B
// active. --dims: MoE every 2nd layer as published; below 128 experts llama.cpp's QK norm is on;
// Scout's rope frequency factors (rope_freqs), so the test size has every feature read.
expertd::Result<SynthModel> Llama4::synth(const std::string&, const SynthDims& d) const {
  archs::SynthSizes s{5120, 48, 128, 1, 8192, 40, 8, 128, 202048, 500000.0f, 1e-5f};
  int n_ff = 16384;
  EXPERTD_TRY(archs::apply_dims(s, d));
  if (d.given()) n_ff = 2 * s.n_ff_exp;
  auto m = archs::synth_base(s, "llama4");
  if (!m) return m;
  m->u32["context_length"] = 1048576;
  m->u32["interleave_moe_layer_step"] = 2;
  m->u32["feed_forward_length"] = n_ff;
  m->u32["expert_gating_func"] = 2;                    // sigmoid
  if (d.given()) m->flags["synth_rope_freqs"] = true;  // Scout's rope factors, at test size
  return m;
}

}  // namespace

std::unique_ptr<Arch> make_arch_llama4() {
  return std::make_unique<Llama4>();
}

}  // namespace engine
