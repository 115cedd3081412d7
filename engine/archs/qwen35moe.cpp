// Qwen3.5-MoE (qwen35moe) and Qwen3-Next (qwen3next): hybrid layers — three gated delta-net
// layers (short causal convolution over [q k v], L2-normalised q and k, a per-head decay
// -exp(A_log) softplus(alpha + dt_bias), beta = sigmoid(b), RMSNorm of the output times silu(z))
// to one layer of gated full attention (the query projection carries a sigmoid output gate per
// head, per-head q/k RMSNorm, partial NeoX RoPE); every block an MoE block with softmax top-k
// renormalised and a shared expert gated by sigmoid(ffn_gate_inp_shexp . x). The two differ in
// the delta-net's value-head order (Qwen3.5's converter tiles them: value head h reads key head
// h % n_k; Qwen3-Next groups them: h / (n_v / n_k)), in how beta and alpha are stored (Qwen3-Next:
// one ssm_beta_alpha, per key head [beta of its value heads, alpha of them]) and in the rope
// (Qwen3.5: interleaved M-RoPE, which for text is NeoX RoPE at the token's position).
#include <algorithm>
#include <cmath>

#include "engine/archs/common.h"
#include "engine/engine.h"

namespace engine {
namespace {

class Qwen35Moe final : public Arch {
 public:
  explicit Qwen35Moe(bool next) : next_(next) {}

  void read_hparams(Meta& m, Hparams& hp) override {
    archs::read_base(m, hp);
    int n_all = hp.n_layer, nextn = 0;
    m.u("nextn_predict_layers", nextn, 0);
    m.u("ssm.conv_kernel", d_conv_);
    m.u("ssm.state_size", d_state_);
    m.u("ssm.group_count", n_k_heads_);
    m.u("ssm.time_step_rank", n_v_heads_);
    m.u("ssm.inner_size", d_inner_);
    n_ff_shexp_ =
        archs::width(m, "blk.0.ffn_gate_shexp.weight", 1, "expert_shared_feed_forward_length");
    archs::read_yarn(m, hp, /*yarn_ok=*/false);  // any rope scaling is refused
    // llama.cpp's qwen35moe and qwen3next route by softmax, renormalised, unscaled, whatever the
    // file says: a file that asks for another routing is refused rather than run differently.
    const RouteOpts r =
        archs::read_routing(m, hp, /*norm_default=*/true, /*sigmoid_default=*/false);
    if (r.sigmoid || !r.norm_topk || r.n_group > 0 || r.w_scale != 1.0f)
      m.fail(
          hp.arch + " routes by softmax with renormalised weights; the file's " +
          "expert_gating_func / expert_weights_norm / expert_weights_scale / expert groups ask " +
          "for another routing, which llama.cpp does not run either");
    if (!m.error().empty()) return;
    if (nextn >= n_all) return m.fail("nextn_predict_layers leaves no layer to run");
    hp.n_layer = n_all - nextn;  // the trailing multi-token-prediction blocks: drafts only
    // The NextN block drafts (llama.cpp's qwen35moe and qwen3next graph_mtp: a full-attention
    // block with the trunk's gated shared expert, GLM-4.5's head), where the file has it.
    if (nextn > 0 &&
        m.tensor_dim("blk." + std::to_string(hp.n_layer) + ".nextn.eh_proj.weight", 0) != kAnyDim)
      hp.n_nextn = nextn;
    if (d_conv_ < 1 || d_conv_ > 64) return m.fail("implausible ssm.conv_kernel");
    if (d_state_ <= 0 || d_state_ > 256) return m.fail("implausible ssm.state_size");
    if (n_k_heads_ <= 0 || n_v_heads_ <= 0 || n_v_heads_ % n_k_heads_)
      return m.fail("ssm.time_step_rank (value heads) must be a multiple of ssm.group_count");
    if (int64_t{d_inner_} != int64_t{d_state_} * n_v_heads_)
      return m.fail("ssm.inner_size must be ssm.state_size x ssm.time_step_rank");
    // Which layers are recurrent: attention.recurrent_layers, else every full_attention_interval-th
    // layer is full attention (llama.cpp's default interval 4).
    recurrent_.assign(hp.n_layer, false);
    if (auto a = m.file().get_number_array(hp.arch + ".attention.recurrent_layers")) {
      if (a->size() != size_t(n_all))
        return m.fail("attention.recurrent_layers has " + std::to_string(a->size()) +
                      " values for " + std::to_string(n_all) + " layers");
      for (int il = 0; il < hp.n_layer; ++il) recurrent_[il] = (*a)[il] != 0;
    } else {
      int interval = 4;
      m.u("full_attention_interval", interval, 4);
      if (interval < 1) return m.fail("full_attention_interval must be positive");
      for (int il = 0; il < hp.n_layer; ++il) recurrent_[il] = (il + 1) % interval != 0;
    }
    if (hp.n_rot > hp.head_dim || hp.n_rot % 2) return m.fail("implausible rope.dimension_count");
    for (int il = 0; il < hp.n_layer; ++il)  // early Qwen3-Next GGUFs: one fused ssm_in
      if (recurrent_[il] &&
          m.tensor_dim("blk." + std::to_string(il) + ".ssm_in.weight", 0) != kAnyDim)
        return m.fail("blk." + std::to_string(il) +
                      ".ssm_in.weight: the legacy Qwen3-Next layout (q, k, v and z interleaved per "
                      "key head) is not supported; convert the model again with llama.cpp's "
                      "convert_hf_to_gguf.py, which writes attn_qkv and attn_gate");
    if (!next_) check_sections(m, hp);
    recurrent_.resize(size_t(n_all), false);  // the NextN blocks attend
  }

  void plan(const Hparams& hp, Plan& p) override {
    hp_ = hp;
    const int64_t E = hp.n_embd, D = hp.head_dim, H = hp.n_head;
    const int64_t key_dim = int64_t{d_state_} * n_k_heads_, value_dim = d_inner_;
    const int64_t conv_dim = 2 * key_dim + value_dim;
    layers_.resize(hp.n_blocks());
    for (int il = 0; il < hp.n_blocks(); ++il) {
      Layer& w = layers_[il];
      p.blk(il);
      p.add(w.attn_norm, "attn_norm.weight", {E}, Role::Norm);
      p.add(w.moe.norm, "post_attention_norm.weight", {E}, Role::Norm);
      if (recurrent_[il]) {
        DeltaOpts& o = w.delta;
        o.n_k_head = n_k_heads_, o.n_v_head = n_v_heads_, o.dk = o.dv = d_state_;
        o.per_head_decay = true, o.tiled_heads = !next_, o.d_conv = d_conv_, o.eps = hp.eps;
        // (E) -> [q (n_k dk) | k (n_k dk) | v (n_v dv)]
        p.add(w.wqkv, "attn_qkv.weight", {E, conv_dim});
        p.add(w.wz, "attn_gate.weight", {E, value_dim});  // the output gate z
        // one depthwise filter over [q k v], {d_conv, channels}, F32 (ggml's ssm_conv)
        p.add(w.conv, "ssm_conv1d.weight", {d_conv_, conv_dim}, Role::Bias);
        p.add(w.dt_b, "ssm_dt.bias", {n_v_heads_}, Role::Bias);
        p.add(o.a, "ssm_a", {n_v_heads_}, Role::Decay);  // -exp(A_log)
        if (next_) {
          // per key head: beta of its value heads, then alpha of them
          p.add(w.beta_alpha, "ssm_ba.weight", {E, 2 * n_v_heads_});
        } else {
          p.add(w.beta, "ssm_beta.weight", {E, n_v_heads_});
          p.add(w.alpha, "ssm_alpha.weight", {E, n_v_heads_});
        }
        p.add(w.o_norm, "ssm_norm.weight", {d_state_}, Role::Norm);
        p.add(w.wo, "ssm_out.weight", {value_dim, E}, Role::AttnOut);
      } else {
        // (E) -> per head [query (D) | gate (D)]
        p.add(w.wq, "attn_q.weight", {E, 2 * H * D});
        p.add(w.wk, "attn_k.weight", {E, archs::kv_width(hp)});
        p.add(w.wv, "attn_v.weight", {E, archs::kv_width(hp)});
        p.add(w.q_norm, "attn_q_norm.weight", {D}, Role::Norm);  // per head
        p.add(w.k_norm, "attn_k_norm.weight", {D}, Role::Norm);
        p.add(w.wo, "attn_output.weight", {H * D, E}, Role::AttnOut);
      }
      w.moe.route = route();
      p.moe(w.moe, hp);
      archs::plan_shared_expert(p, w.moe, hp, n_ff_shexp_, /*gated=*/true);
    }
  }

  KvRows kv_rows(const Hparams& hp, int il, int) const override {
    if (recurrent_[il]) return {0, 0, layers_[il].delta.state_floats()};
    return archs::gqa_rows(hp);
  }
  const MoeWeights* moe(int il) const override { return &layers_[il].moe; }

  void block(Engine& e, int il, Act x) const override {
    Ops& ops = e.ops();
    const Layer& w = layers_[il];
    Act h = ops.rms_norm(x, w.attn_norm, hp_.eps);
    ops.add(x, recurrent_[il] ? delta_net(e, il, w, h) : attention(e, il, w, h));
    ops.rms_norm(x, w.moe.norm, h, hp_.eps);
    ops.add(x, e.moe(il, w.moe, h));
  }

  std::vector<std::string> synth_presets() const override {
    if (next_) return {"qwen3-next-80b-a3b"};
    return {"qwen3.5-397b-a17b"};
  }
  // The published shapes:
  // - Qwen3.5-397B-A17B: 60 layers (llama.cpp's qwen35moe names a 60-layer file 397B_A17B),
  //   n_embd 4,096, 32 query heads and 2 KV heads of 256 (the model's public specification, e.g.
  //   pcpartguide.com/local-llms/qwen-3.5-397b-a17b), 512 routed experts; top-10 of experts 1,024
  //   wide, a shared expert of 1,024, 64 value heads over 16 key heads of 128 in the delta-net:
  //   the config.json values, which give the published 397B total and 17B active parameters
  //   (512 x 3 x 4,096 x 1,024 x 60 = 386B routed; 10 of them, the shared expert, attention and
  //   embeddings = 17.2B). Vocabulary 248,320 (Qwen3.5's tokenizer); rope base 10^7, a quarter of
  //   each head rotated, interleaved M-RoPE sections [11, 11, 10] (llama.cpp's converter's
  //   default, conversion/qwen.py); full attention every 4th layer; one MTP layer (config.json's
  //   mtp_num_hidden_layers; at test size too).
  // - Qwen3-Next-80B-A3B: transformers' Qwen3NextConfig defaults, which its docstring says are
  //   Qwen3-Next-80B-A3B-Instruct's: 48 layers, n_embd 2,048, 16 query and 2 KV heads of 256,
  //   512 experts of 512, top-10, a shared expert of 512, delta-net 16 key and 32 value heads of
  //   128, conv 4, vocabulary 151,936, a quarter of each head rotated, rope base 10^7; one MTP
  //   layer (Qwen/Qwen3-Next-80B-A3B-Instruct's config.json: mtp_num_hidden_layers 1).
  expertd::Result<SynthModel> synth(const std::string&, const SynthDims& d) const override {
    archs::SynthSizes s = next_ ? archs::SynthSizes{2048, 48, 512, 10, 512, 16, 2, 256, 151936}
                                : archs::SynthSizes{4096, 60, 512, 10, 1024, 32, 2, 256, 248320};
    s.rope_base = 1e7f;
    int k_heads = 16, v_heads = next_ ? 32 : 64, state = 128, shexp = s.n_ff_exp;
    EXPERTD_TRY(archs::apply_dims(s, d));
    if (d.given()) k_heads = 2, v_heads = 4, state = s.head_dim, shexp = s.n_ff_exp;
    s.n_rot = std::max(2, s.head_dim / 4);
    auto m = archs::synth_base(s, next_ ? "qwen2" : "qwen35");
    if (!m) return m;
    m->u32["expert_shared_feed_forward_length"] = shexp;
    m->u32["ssm.conv_kernel"] = 4;
    m->u32["ssm.state_size"] = state;
    m->u32["ssm.group_count"] = k_heads;
    m->u32["ssm.time_step_rank"] = v_heads;
    m->u32["ssm.inner_size"] = state * v_heads;
    m->u32["full_attention_interval"] = 4;
    // The MTP block after the trunk, a full-attention one as llama.cpp's converter writes it
    // (conversion/qwen.py): expert-pack synth repeats the trunk's last full-attention layer's
    // tensors for it (a trunk of fewer than 4 layers has none, and gets no MTP block).
    const int trunk = d.layers > 0 ? std::min<int>(s.n_layer, int(d.layers)) : s.n_layer;
    if (trunk >= 4) {
      m->u32["block_count"] += 1, m->u32["nextn_predict_layers"] = 1;
      m->nextn_like = trunk / 4 * 4 - 1;
    }
    if (!next_) {
      const int pairs = s.n_rot / 2;  // [11, 11, 10] at 32 pairs, in the same proportions
      m->arrays["rope.dimension_sections"] = {(pairs + 2) / 3, (pairs + 1) / 3, pairs / 3, 0};
    }
    m->specials = {"<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>",
                   "<think>",      "</think>"};  // <|endoftext|> is synth's end of text
    return m;
  }

 private:
  struct Layer {
    Tensor attn_norm;
    // gated delta-net
    DeltaOpts delta;
    Tensor wqkv, wz, conv, dt_b, beta, alpha, beta_alpha, o_norm;
    // gated attention
    Tensor wq, wk, wv, q_norm, k_norm;
    Tensor wo;  // attn_output or ssm_out
    MoeWeights moe;
  };

  static RouteOpts route() {
    RouteOpts r;
    r.norm_topk = true;
    return r;
  }

  // Interleaved M-RoPE with the text positions (t = h = w = the token's, the fourth 0): a rotary
  // pair takes the token's position unless the sections leave it to the fourth, which would not
  // rotate it. Sections that leave any pair so are refused, naming the key.
  void check_sections(Meta& m, const Hparams& hp) {
    auto a = m.file().get_number_array(hp.arch + ".rope.dimension_sections");
    if (!a) return m.fail("missing metadata " + hp.arch + ".rope.dimension_sections");
    if (a->size() < 3) return m.fail(hp.arch + ".rope.dimension_sections needs 4 values");
    int s[4] = {0, 0, 0, 0};
    for (size_t i = 0; i < std::min<size_t>(4, a->size()); ++i) s[i] = int((*a)[i]);
    const int total = s[0] + s[1] + s[2] + s[3];
    if (total <= 0 || total > hp.n_rot / 2 + 0 || s[0] < 0 || s[1] < 0 || s[2] < 0 || s[3] < 0)
      return m.fail(hp.arch + ".rope.dimension_sections do not fit rope.dimension_count");
    for (int i = 0; i < hp.n_rot / 2; ++i) {
      const int sector = i % total;
      const bool text = (sector % 3 == 1 && sector < 3 * s[1]) ||
                        (sector % 3 == 2 && sector < 3 * s[2]) ||
                        (sector % 3 == 0 && sector < 3 * s[0]);
      if (!text)
        return m.fail(hp.arch + ".rope.dimension_sections leave rotary pair " + std::to_string(i) +
                      " to the extra position, which is not supported");
    }
  }

  Act delta_net(Engine& e, int il, const Layer& w, Act h) const {
    Ops& ops = e.ops();
    const DeltaOpts& d = w.delta;
    const int64_t T = h.rows, key_dim = d.n_k_head * d.dk, value_dim = d.n_v_head * d.dv;
    DeltaOpts o = d;  // the convolution's filter rows split three ways
    o.conv_q = w.conv.rows(0, key_dim), o.conv_k = w.conv.rows(key_dim, key_dim);
    o.conv_v = w.conv.rows(2 * key_dim, value_dim);
    Act q = ops.alloc(T, key_dim), k = ops.alloc(T, key_dim), v = ops.alloc(T, value_dim);
    ops.matmul(w.wqkv.rows(0, key_dim), h, q);
    ops.matmul(w.wqkv.rows(key_dim, key_dim), h, k);
    ops.matmul(w.wqkv.rows(2 * key_dim, value_dim), h, v);
    Act beta = ops.alloc(T, d.n_v_head), g = ops.alloc(T, d.n_v_head);
    if (w.beta_alpha) {  // one product, then per key head its r betas and r alphas apart
      const int64_t r = d.n_v_head / d.n_k_head;
      Act ba = ops.matmul(w.beta_alpha, h);
      for (int64_t kh = 0; kh < d.n_k_head; ++kh) {
        ops.copy(columns(beta, r * kh, r), columns(ba, 2 * r * kh, r));
        ops.copy(columns(g, r * kh, r), columns(ba, 2 * r * kh + r, r));
      }
    } else {
      ops.matmul(w.beta, h, beta);
      ops.matmul(w.alpha, h, g);
    }
    ops.add_bias(g, w.dt_b);
    Act out = ops.alloc(T, value_dim);
    ops.delta_rule(il, o, q, k, v, g, beta, out);
    ops.rms_norm(out, w.o_norm, out, hp_.eps, d.dv);
    ops.mul_act(out, ops.matmul(w.wz, h), Unary::Silu);
    return ops.matmul(w.wo, out);
  }

  Act attention(Engine& e, int il, const Layer& w, Act h) const {
    Ops& ops = e.ops();
    const Hparams& hp = hp_;
    const int64_t T = h.rows, D = hp.head_dim;
    Act qg = ops.matmul(w.wq, h), k = ops.matmul(w.wk, h), v = ops.matmul(w.wv, h);
    Act q = ops.alloc(T, hp.n_head * D), gate = ops.alloc(T, hp.n_head * D);
    for (int64_t hd = 0; hd < hp.n_head; ++hd) {  // per head [query | gate]
      ops.copy(columns(q, hd * D, D), columns(qg, 2 * hd * D, D));
      ops.copy(columns(gate, hd * D, D), columns(qg, 2 * hd * D + D, D));
    }
    ops.rms_norm(q, w.q_norm, q, hp.eps, D);
    ops.rms_norm(k, w.k_norm, k, hp.eps, D);
    const RopeOpts rope{hp.rope_base, /*neox=*/true};
    ops.rope(q, D, 0, hp.n_rot, rope);
    ops.rope(k, D, 0, hp.n_rot, rope);
    Act att = ops.alloc(T, hp.n_head * D);
    ops.attention(il, q, k, v, {hp.n_head, hp.n_head_kv, D, 1.0f / std::sqrt(float(D))}, att);
    ops.mul_act(att, gate, Unary::Sigmoid);
    return ops.matmul(w.wo, att);
  }

  bool next_;
  Hparams hp_;
  int d_conv_ = 0, d_state_ = 0, n_k_heads_ = 0, n_v_heads_ = 0, d_inner_ = 0;
  int64_t n_ff_shexp_ = 0;
  std::vector<bool> recurrent_;
  std::vector<Layer> layers_;
};

}  // namespace

std::unique_ptr<Arch> make_arch_qwen35moe() {
  return std::make_unique<Qwen35Moe>(/*next=*/false);
}
std::unique_ptr<Arch> make_arch_qwen3next() {
  return std::make_unique<Qwen35Moe>(/*next=*/true);
}

}  // namespace engine
