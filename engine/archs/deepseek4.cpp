// DeepSeek-V4 (deepseek4): hyper-connections (hyper_connection.count residual streams; each
// sub-layer reads a sigmoid-weighted sum of them and writes back a Sinkhorn-normalised mix of
// them plus its output, the head reduces them the same way); attention with one shared
// key/value row per position (MQA, values are the keys), q LoRA, per-head query norms, attention
// sinks, a sliding window, and per layer (attention.compress_ratios) compressed entries of 128
// positions or of 4 positions picked by the lightning indexer, rotated with their own base and
// YaRN; the rotation taken back off the output; a grouped output projection through a LoRA
// rank; sqrt-softplus routing with a selection bias, or hash routing by the token in the first
// hash_layer_count layers; limited SwiGLU for routed and shared experts (per-layer limits).
// Trailing NextN (multi-token prediction) blocks are kept in the file but never run (synth writes
// one, as the published model has).
#include <algorithm>
#include <cmath>

#include "engine/archs/common.h"
#include "engine/engine.h"

namespace engine {
namespace {

class Deepseek4 final : public Arch {
 public:
  void read_hparams(Meta& m, Hparams& hp) override {
    int n_all = 0, nextn = 0;
    m.u("embedding_length", hp.n_embd);
    m.u("block_count", n_all);
    m.u("attention.head_count", hp.n_head);
    m.u("attention.head_count_kv", hp.n_head_kv, 1);
    m.u("attention.key_length", hp.head_dim);
    int v_len = 0;
    m.u("attention.value_length", v_len, hp.head_dim);
    m.u("rope.dimension_count", hp.n_rot);
    m.u("expert_count", hp.n_expert);
    m.u("expert_used_count", hp.n_expert_used);
    m.u("context_length", hp.n_ctx_train, 4096);
    m.f("attention.layer_norm_rms_epsilon", hp.eps, 1e-6f);
    m.f("rope.freq_base", hp.rope_base, 10000.0f);
    m.u("nextn_predict_layers", nextn, 0);
    m.u("attention.q_lora_rank", q_lora_);
    m.u("attention.sliding_window", window_);
    m.u("expert_shared_count", n_shared_);
    m.u("attention.indexer.head_count", idx_heads_);
    m.u("attention.indexer.key_length", idx_dim_);
    m.u("attention.indexer.top_k", top_k_);
    m.u("attention.output_group_count", o_groups_);
    m.u("attention.output_lora_rank", o_lora_);
    m.u("hyper_connection.count", hc_.hc);
    m.u("hyper_connection.sinkhorn_iterations", hc_.sinkhorn_iters);
    m.u("hash_layer_count", n_hash_, 0);
    required_f(m, "attention.compress_rope_freq_base", compress_base_);
    required_f(m, "hyper_connection.epsilon", hc_.eps);
    if (!m.has("expert_weights_norm")) m.fail("missing metadata deepseek4.expert_weights_norm");
    if (!m.has("expert_weights_scale")) m.fail("missing metadata deepseek4.expert_weights_scale");
    int gating = 0;
    m.u("expert_gating_func", gating);
    if (!m.error().empty()) return;
    if (gating != 4)
      return m.fail("expert_gating_func = " + std::to_string(gating) +
                    ": DeepSeek-V4 routes by sqrt-softplus (4)");
    m.b("expert_weights_norm", route_.norm_topk, true);
    m.f("expert_weights_scale", route_.w_scale, 1.0f);
    if (route_.w_scale == 0.0f) route_.w_scale = 1.0f;
    route_.sqrt_softplus = true;
    // llama.cpp counts the NextN blocks only when the first one is in the file (a file of
    // metadata alone, synth's plan, has them all to come).
    if (nextn > 0 && m.tensor_dim("token_embd.weight", 0) != kAnyDim &&
        m.tensor_dim("blk." + std::to_string(n_all - nextn) + ".nextn.eh_proj.weight", 0) ==
            kAnyDim)
      nextn = 0;
    if (nextn >= n_all) return m.fail("nextn_predict_layers leaves no layer to run");
    hp.n_layer = n_all - nextn;
    ratios_ = per_layer_numbers(m, "attention.compress_ratios", n_all);
    // The NextN block drafts where it is a plain window, as the published model's (llama.cpp's
    // MTP graph runs no compressor).
    if (nextn > 0 && m.error().empty() && ratios_[size_t(hp.n_layer)] == 0) hp.n_nextn = nextn;
    clamp_exp_ = per_layer_numbers(m, "swiglu_clamp_exp", n_all);
    clamp_shexp_ = m.has("swiglu_clamp_shexp") ? per_layer_numbers(m, "swiglu_clamp_shexp", n_all)
                                               : clamp_exp_;
    hp.n_ff_exp = m.tensor_dim("blk.0.ffn_gate_exps.weight", 1);
    if (hp.n_ff_exp == kAnyDim) {  // a core GGUF
      int ff = 0;
      m.u("expert_feed_forward_length", ff);
      hp.n_ff_exp = ff;
    }
    if (!m.error().empty()) return;
    for (int il = 0; il < hp.n_layer; ++il)
      if (ratios_[il] != 0 && ratios_[il] != 4 && ratios_[il] != 128)
        return m.fail("attention.compress_ratios[" + std::to_string(il) + "] = " +
                      std::to_string(int(ratios_[il])) + ": DeepSeek-V4 compresses by 0, 4 or 128");
    if (hp.n_head_kv != 1) return m.fail("attention.head_count_kv: DeepSeek-V4 shares one KV head");
    if (v_len != hp.head_dim) return m.fail("attention.value_length must equal key_length");
    if (hp.n_rot <= 0 || hp.n_rot >= hp.head_dim || hp.n_rot > idx_dim_)
      return m.fail("rope.dimension_count must be below attention.key_length and the indexer's");
    if (hc_.hc < 1 || hc_.hc > 16) return m.fail("implausible hyper_connection.count");
    if (hc_.sinkhorn_iters < 1) return m.fail("hyper_connection.sinkhorn_iterations must be >= 1");
    if (o_groups_ < 1 || hp.n_head % o_groups_ || o_lora_ < 1)
      return m.fail("attention.output_group_count must divide attention.head_count");
    if (window_ < 1) return m.fail("attention.sliding_window must be positive");
    if (top_k_ < 1 || idx_heads_ < 1 || idx_dim_ < 1) return m.fail("implausible indexer sizes");
    if (n_hash_ > hp.n_layer) return m.fail("hash_layer_count exceeds block_count");
    // YaRN applies to the compressed layers, with their base; llama.cpp's attention factor
    // cancels YaRN's magnitude scaling.
    Hparams compressed = hp;
    compressed.rope_base = compress_base_;
    if (auto y = archs::read_yarn(m, compressed, /*yarn_ok=*/true)) yarn_ = *y, yarn_.mscale = 1.0f;
  }

  void plan(const Hparams& hp, Plan& p) override {
    hp_ = hp;
    const int64_t E = hp.n_embd, H = hp.n_head, D = hp.head_dim, hcw = hc_.hc * E,
                  mix = (2 + hc_.hc) * hc_.hc, ID = idx_dim_;
    yarn_on_ = yarn_.ext_factor != 0.0f;
    p.add(head_.scale_w, "output_hc_fn.weight", {hcw, hc_.hc}, Role::Bias);
    p.add(head_.opts.base, "output_hc_base.weight", {hc_.hc}, Role::Bias);
    p.add(head_.opts.scale, "output_hc_scale.weight", {1}, Role::Bias);
    head_.opts.hc = hc_.hc, head_.opts.eps = hc_.eps;
    layers_.resize(hp.n_blocks());
    for (int il = 0; il < hp.n_blocks(); ++il) {
      Layer& w = layers_[il];
      const int ratio = static_cast<int>(ratios_[il]);
      p.blk(il);
      for (auto [mx, name] : {std::pair{&w.hc_attn, "hc_attn"}, std::pair{&w.hc_ffn, "hc_ffn"}}) {
        mx->opts = hc_;
        p.add(mx->scale_w, std::string(name) + "_fn.weight", {hcw, mix}, Role::Bias);
        p.add(mx->opts.base, std::string(name) + "_base.weight", {mix}, Role::Bias);
        p.add(mx->opts.scale, std::string(name) + "_scale.weight", {3}, Role::Bias);
      }
      p.add(w.attn_norm, "attn_norm.weight", {E}, Role::Norm);
      Dsv4AttnOpts& o = w.attn;
      o.n_head = H, o.window = window_, o.ratio = ratio, o.head_dim = D, o.n_rot = hp.n_rot;
      o.scale = 1.0f / std::sqrt(float(D)), o.eps = hp.eps;
      o.rope = compressed_rope();
      p.add(o.sinks, "attn_sinks.weight", {H}, Role::Bias);
      p.add(w.wq_a, "attn_q_a.weight", {E, q_lora_});
      p.add(w.q_a_norm, "attn_q_a_norm.weight", {q_lora_}, Role::Norm);
      p.add(w.wq_b, "attn_q_b.weight", {q_lora_, H * D});
      p.add(w.wkv, "attn_kv.weight", {E, D});
      p.add(w.kv_norm, "attn_kv_a_norm.weight", {D}, Role::Norm);
      // {o_group_dim, o_lora_rank x groups}: group g's rows are [g o_lora, (g + 1) o_lora)
      p.add(w.wo_a, "attn_output_a.weight", {H * D / o_groups_, o_lora_ * o_groups_});
      p.add(w.wo_b, "attn_output_b.weight", {o_groups_ * o_lora_, E}, Role::AttnOut);
      if (ratio != 0) {
        const int64_t coff = o.coff();
        p.add(w.comp_wkv, "attn_compressor_kv.weight", {E, coff * D});
        p.add(w.comp_wgate, "attn_compressor_gate.weight", {E, coff * D});
        p.add(o.ape, "attn_compressor_ape.weight", {coff * D, ratio}, Role::Bias);
        p.add(o.norm, "attn_compressor_norm.weight", {D}, Role::Norm);
      }
      if (ratio == 4) {
        o.idx_heads = idx_heads_, o.idx_dim = ID, o.top_k = top_k_;
        o.idx_scale = 1.0f / std::sqrt(float(ID * idx_heads_));
        p.add(w.idx_proj, "indexer.proj.weight", {E, idx_heads_});
        p.add(w.idx_q_b, "indexer.attn_q_b.weight", {q_lora_, idx_heads_ * ID});
        p.add(w.idx_wkv, "indexer_compressor_kv.weight", {E, 2 * ID});
        p.add(w.idx_wgate, "indexer_compressor_gate.weight", {E, 2 * ID});
        p.add(o.idx_ape, "indexer_compressor_ape.weight", {2 * ID, ratio}, Role::Bias);
        p.add(o.idx_norm, "indexer_compressor_norm.weight", {ID}, Role::Norm);
      }
      p.add(w.moe.norm, "ffn_norm.weight", {E}, Role::Norm);
      w.moe.route = route_;
      w.moe.act = {Activation::SwigluLimit, 1.0f, 0.0f, clamp_exp_[il]};
      p.moe(w.moe, hp, /*expert_biases=*/false, /*hashed=*/il < n_hash_);
      const int64_t F = hp.n_ff_exp * n_shared_;
      p.add(w.shexp.gate, "ffn_gate_shexp.weight", {E, F});
      p.add(w.shexp.up, "ffn_up_shexp.weight", {E, F});
      p.add(w.shexp.down, "ffn_down_shexp.weight", {F, E});
      w.shexp.act = {Activation::SwigluLimit, 1.0f, 0.0f, clamp_shexp_[il]};
      if (clamp_exp_[il] <= 1e-6f) w.moe.act = {};  // llama.cpp: no limit below 1e-6
      if (clamp_shexp_[il] <= 1e-6f) w.shexp.act = {};
    }
  }

  KvRows kv_rows(const Hparams&, int il, int n_ctx) const override {
    return layers_[il].attn.cache_rows(n_ctx);
  }
  const MoeWeights* moe(int il) const override { return &layers_[il].moe; }

  int64_t residual_cols(const Hparams& hp) const override { return int64_t{hc_.hc} * hp.n_embd; }
  void begin_eval(Engine& e, Act emb, Act x) const override { e.ops().repeat(emb, hc_.hc, x); }
  Act end_eval(Engine& e, Act x) const override {
    Ops& ops = e.ops();
    Act mixes = ops.matmul(head_.scale_w, ops.rms_norm(x, Tensor{}, hp_.eps));
    Act out = ops.alloc(x.rows, hp_.n_embd);
    ops.hc_pre(x, mixes, head_.opts, /*head=*/true, out, Act{});
    return out;
  }
  // NextN drafting (llama.cpp's deepseek4 graph_mtp): the hidden row is the hyper-connection
  // streams before the output head; each stream's row is eh_proj([enorm(embedding),
  // hnorm(stream)]); the head is the output's hyper-connection head, then shared_head_norm.
  int64_t nextn_cols(const Hparams& hp) const override { return residual_cols(hp); }
  Act nextn_hidden(Engine&, const Model&, Act x, Act) const override { return x; }
  Act nextn_input(Engine& e, const Model&, const NextnWeights& w, Act emb, Act h) const override {
    Ops& ops = e.ops();
    const int64_t T = emb.rows, n = hp_.n_embd, hc = hc_.hc;
    Act en = ops.rms_norm(emb, w.enorm, hp_.eps), rep = ops.alloc(T, hc * n);
    ops.repeat(en, int(hc), rep);
    Act cat = ops.alloc(T * hc, 2 * n);  // a row per (token, stream)
    ops.copy(columns(cat, 0, n), Act{rep.data, T * hc, n});
    ops.rms_norm(Act{h.data, T * hc, n}, w.hnorm, columns(cat, n, n), hp_.eps);
    Act x = ops.matmul(w.eh_proj, cat);
    return Act{x.data, T, hc * n};
  }
  Act nextn_head(Engine& e, const Model& m, const NextnWeights& w, Act x,
                 Act* next_hidden) const override {
    if (next_hidden) *next_hidden = x;
    return e.ops().rms_norm(end_eval(e, x), head_norm(m, w), hp_.eps);
  }
  // The prefetcher's view: the mean of the streams.
  Act router_stream(Engine& e, Act x) const override {
    Act out = e.ops().alloc(x.rows, hp_.n_embd);
    e.ops().hc_pre(x, Act{}, head_.opts, /*head=*/true, out, Act{});
    return out;
  }

  void block(Engine& e, int il, Act x) const override {
    Ops& ops = e.ops();
    const Layer& w = layers_[il];
    const int64_t T = x.rows;
    Act y = ops.alloc(T, x.cols);
    {
      auto [in, pc] = mix(ops, w.hc_attn, x);
      Act h = ops.rms_norm(in, w.attn_norm, hp_.eps);
      Act a = attention(e, il, w, h);
      ops.hc_post(a, x, pc, hc_.hc, y);
    }
    auto [in, pc] = mix(ops, w.hc_ffn, y);
    Act h = ops.rms_norm(in, w.moe.norm, hp_.eps);
    Act f = e.moe(il, w.moe, h);
    Act s = ops.alloc(T, hp_.n_embd);
    ops.ffn(w.shexp, h, s);
    ops.add(f, s);
    ops.hc_post(f, y, pc, hc_.hc, x);
  }

  std::vector<std::string> synth_presets() const override { return {"deepseek-v4-flash"}; }
  // The seed's figures: 43 blocks, 256 experts, top-6, 13.4 MB MXFP4 expert blocks (4,096 wide,
  // 2,048 per expert); the rest as DeepSeek-V4-Flash's config is published and llama.cpp's
  // converter records it (64 heads of 512 with 64 rotated, q LoRA 1,024, 8 output groups through
  // a 1,024 rank, a 128-position window, 64 indexer heads of 128 picking 512, 4 hyper-connection
  // streams, 3 hash-routed layers, SwiGLU limit 10, YaRN 16x 65,536 on the compressed layers).
  // --dims scales it to a test size with every
  // feature kept: small window and top-k, so that the window, compression and indexer selection
  // all act within a short prompt.
  expertd::Result<SynthModel> synth(const std::string&, const SynthDims& d) const override {
    archs::SynthSizes s{4096, 43, 256, 6, 2048, 64, 1, 512, 129280};
    int q_lora = 1024, o_groups = 8, o_lora = 1024, window = 128, idx_heads = 64, idx_dim = 128,
        top_k = 512, hash = 3, rope = 64;
    float limit = 10.0f, limit_shexp = 10.0f;
    EXPERTD_TRY(archs::apply_dims(s, d));
    s.n_head_kv = 1;
    if (d.given()) {
      q_lora = s.n_embd / 2, o_groups = s.n_head % 2 ? 1 : 2, o_lora = s.n_embd / 4, window = 8,
      idx_heads = 2, idx_dim = 64, top_k = 3, hash = s.n_layer > 1 ? 1 : 0,
      rope = std::max(2, s.head_dim / 2), limit = 2.0f, limit_shexp = 3.0f;
      if (s.head_dim == idx_dim) idx_dim = 2 * s.head_dim;  // llama.cpp rotates equal-sized keys
    }
    if (d.layers > 0) s.n_layer = std::min<int>(s.n_layer, static_cast<int>(d.layers));
    s.n_rot = rope;
    auto m = archs::synth_base(s, "deepseek-v3");
    if (!m) return m;
    m->u32.erase("feed_forward_length");
    // The first two layers a plain window, then compressed by 4 (with the indexer) and by 128
    // in turn.
    std::vector<int32_t> ratios(s.n_layer);
    for (int il = 0; il < s.n_layer; ++il) ratios[il] = il < 2 ? 0 : il % 2 ? 128 : 4;
    if (d.given() && s.n_layer >= 2)  // test sizes: one layer of each kind as soon as possible
      for (int il = 0; il < s.n_layer; ++il) ratios[il] = il == 0 ? 0 : il % 2 ? 4 : 128;
    // One NextN (MTP) block after the trunk, as the published model has: a block like the last
    // (routed by its router, not hashed) but of a plain window (its compress ratio 0, as the
    // published config's last entry: llama.cpp's MTP graph runs no compressor), plus the
    // projection of [embedding, hidden state] and its norms.
    const int nextn = hash < s.n_layer ? 1 : 0;
    if (nextn) {
      ratios.push_back(0);
      m->nextn_drop = {"attn_compressor", "indexer"};
    }
    const size_t n_all = size_t(s.n_layer + nextn);
    m->u32["block_count"] = uint32_t(n_all);
    if (nextn) m->u32["nextn_predict_layers"] = 1, m->nextn_like = s.n_layer - 1;
    m->arrays["attention.compress_ratios"] = ratios;
    m->farrays["swiglu_clamp_exp"] = std::vector<float>(n_all, limit);
    m->farrays["swiglu_clamp_shexp"] = std::vector<float>(n_all, limit_shexp);
    m->u32["attention.q_lora_rank"] = q_lora;
    m->u32["attention.sliding_window"] = window;
    m->u32["expert_shared_count"] = 1;
    m->u32["attention.indexer.head_count"] = idx_heads;
    m->u32["attention.indexer.key_length"] = idx_dim;
    m->u32["attention.indexer.top_k"] = top_k;
    m->u32["attention.output_group_count"] = o_groups;
    m->u32["attention.output_lora_rank"] = o_lora;
    m->u32["hyper_connection.count"] = 4;
    m->u32["hyper_connection.sinkhorn_iterations"] = 20;
    m->u32["hash_layer_count"] = hash;
    m->u32["expert_gating_func"] = 4;
    m->u32["embedding_length_out"] = 4 * s.n_embd;
    m->flags["expert_weights_norm"] = true;
    m->f32["expert_weights_scale"] = 1.5f;
    m->f32["hyper_connection.epsilon"] = 1e-6f;
    m->f32["attention.compress_rope_freq_base"] = 160000.0f;
    m->u32["context_length"] = 1048576;
    // YaRN on the compressed layers, 16x a 65,536-position training context (the published
    // config's rope_scaling as llama.cpp's converter writes it)
    m->strings["rope.scaling.type"] = "yarn";
    m->f32["rope.scaling.factor"] = 16.0f;
    m->u32["rope.scaling.original_context_length"] = 65536;
    m->f32["rope.scaling.yarn_beta_fast"] = 32.0f;
    m->f32["rope.scaling.yarn_beta_slow"] = 1.0f;
    m->u32["vocab_size"] = s.n_vocab;
    m->specials = {"<｜begin▁of▁sentence｜>",
                   "<｜end▁of▁sentence｜>",
                   "<｜User｜>",
                   "<｜Assistant｜>",
                   "<think>",
                   "</think>"};
    return m;
  }

 private:
  // One hyper-connection mix: hc_fn (F32 {hc n_embd, (2 + hc) hc}), its scale and base.
  struct Mix {
    Tensor scale_w;
    HcOpts opts;
  };
  struct Layer {
    Mix hc_attn, hc_ffn;
    Tensor attn_norm, wq_a, q_a_norm, wq_b, wkv, kv_norm, wo_a, wo_b;
    Tensor comp_wkv, comp_wgate;                   // ratio > 0
    Tensor idx_proj, idx_q_b, idx_wkv, idx_wgate;  // ratio 4
    Dsv4AttnOpts attn;
    MoeWeights moe;
    FfnWeights shexp;
  };
  struct MixOut {
    Act in, pc;
  };

  static void required_f(Meta& m, const std::string& key, float& v) {
    if (!m.has(key)) return m.fail("missing metadata deepseek4." + key);
    m.f(key, v, 0.0f);
  }
  // A per-layer array (of at least n numbers) or one number for every layer.
  static std::vector<float> per_layer_numbers(Meta& m, const std::string& key, int n) {
    std::vector<float> v(std::max(n, 0), 0.0f);
    const std::string k = "deepseek4." + key;
    if (auto x = m.file().get_float(k)) {
      std::fill(v.begin(), v.end(), static_cast<float>(*x));
      return v;
    }
    auto a = m.file().get_number_array(k);
    if (!a) {
      m.fail("missing metadata " + k);
      return v;
    }
    if (a->size() < v.size()) {
      m.fail(k + " has " + std::to_string(a->size()) + " values for " + std::to_string(n) +
             " layers");
      return v;
    }
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((*a)[i]);
    return v;
  }

  RopeOpts layer_rope(int il) const {
    if (ratios_[il] == 0) return {hp_.rope_base, /*neox=*/false};
    return compressed_rope();
  }
  RopeOpts compressed_rope() const {
    return {compress_base_, /*neox=*/false, yarn_on_ ? &yarn_ : nullptr};
  }

  MixOut mix(Ops& ops, const Mix& w, Act x) const {
    Act mixes = ops.matmul(w.scale_w, ops.rms_norm(x, Tensor{}, hp_.eps));
    MixOut r{ops.alloc(x.rows, hp_.n_embd), ops.alloc(x.rows, hc_.hc + hc_.hc * hc_.hc)};
    ops.hc_pre(x, mixes, w.opts, /*head=*/false, r.in, r.pc);
    return r;
  }

  Act attention(Engine& e, int il, const Layer& w, Act h) const {
    Ops& ops = e.ops();
    const Dsv4AttnOpts& o = w.attn;
    const int64_t D = o.head_dim, R = o.n_rot;
    const RopeOpts rope = layer_rope(il);
    Act qr = ops.matmul(w.wq_a, h);
    ops.rms_norm(qr, w.q_a_norm, qr, hp_.eps);
    Act q = ops.matmul(w.wq_b, qr);
    ops.rms_norm(q, Tensor{}, q, hp_.eps, D);  // per head, unweighted
    ops.rope(q, D, D - R, R, rope);
    Act kv = ops.matmul(w.wkv, h);
    ops.rms_norm(kv, w.kv_norm, kv, hp_.eps);
    ops.rope(kv, D, D - R, R, rope);
    Dsv4CompressIn c;
    if (o.ratio != 0)
      c.comp_kv = ops.matmul(w.comp_wkv, h), c.comp_score = ops.matmul(w.comp_wgate, h);
    if (o.ratio == 4) c.idx_kv = ops.matmul(w.idx_wkv, h), c.idx_score = ops.matmul(w.idx_wgate, h);
    ops.dsv4_compress(il, o, c);
    // The compressed entries: all a token sees, or (ratio 4, once a token sees more than top_k)
    // the lightning indexer's top_k of them.
    Act sel;
    if (o.ratio == 4 && ops.end_position() / o.ratio > o.top_k) {
      Act iq = ops.matmul(w.idx_q_b, qr);
      ops.rope(iq, o.idx_dim, o.idx_dim - R, R, compressed_rope());
      Act scores = ops.dsv4_index(il, o, iq, ops.matmul(w.idx_proj, h));
      sel = ops.alloc(h.rows, o.top_k);
      ops.top_k(scores, o.top_k, sel);
    }
    Act att = ops.alloc(h.rows, o.n_head * D);
    ops.attention_dsv4(il, o, q, kv, sel, att);
    RopeOpts back = rope;
    back.inverse = true;
    ops.rope(att, D, D - R, R, back);
    // The grouped output projection: group g's heads (its columns of att) through its rows of
    // wo_a into its columns of oa.
    const int64_t C = att.cols / o_groups_, L = o_lora_;
    Act oa = ops.alloc(h.rows, o_groups_ * L);
    for (int g = 0; g < o_groups_; ++g)
      ops.matmul(w.wo_a.rows(g * L, L), columns(att, g * C, C), columns(oa, g * L, L));
    return ops.matmul(w.wo_b, oa);
  }

  Hparams hp_;
  RouteOpts route_;
  HcOpts hc_;
  Mix head_;
  kernels::Yarn yarn_;
  bool yarn_on_ = false;
  float compress_base_ = 0.0f;
  int q_lora_ = 0, window_ = 0, n_shared_ = 0, idx_heads_ = 0, idx_dim_ = 0, top_k_ = 0,
      o_groups_ = 0, o_lora_ = 0, n_hash_ = 0;
  std::vector<float> ratios_, clamp_exp_, clamp_shexp_;
  std::vector<Layer> layers_;
};

}  // namespace

std::unique_ptr<Arch> make_arch_deepseek4() {
  return std::make_unique<Deepseek4>();
}

}  // namespace engine
