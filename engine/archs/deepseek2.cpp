// DeepSeek-V2/V3 (and Kimi-K2, same GGUF arch; deepseek2): multi-head latent attention (q_lora
// and kv_lora, split attn_k_b / attn_v_b, RoPE on the last qk_rope dims, adjacent pairs),
// leading dense layers, sigmoid or softmax gating with the exp_probs_b selection bias and expert
// groups, routed weights renormalised and scaled, an ungated shared expert. GLM-4.7-Flash is one
// too: its trailing MTP block drafts (Engine::set_nextn; llama.cpp's deepseek2 graph_mtp: the
// decoder block of layer n_layer, GLM-4.5's head).
#include "engine/archs/deepseek2.h"

#include <algorithm>
#include <cmath>

namespace engine {
namespace archs {

void Deepseek2::read_hparams(Meta& m, Hparams& hp) {
  int nextn = 0;
  m.u("nextn_predict_layers", nextn, 0);
  m.u("leading_dense_block_count", n_dense_lead_, 0);
  read_base(m, hp, n_dense_lead_);
  if (!m.error().empty()) return;
  // The trailing multi-token-prediction blocks (GLM-4.7-Flash's converter keeps its one, as
  // llama.cpp's Glm4MoeLiteModel): drafts only, never trunk layers.
  if (nextn >= hp.n_layer) return m.fail("nextn_predict_layers leaves no layer to run");
  hp.n_layer -= nextn;
  if (nextn > 0 &&
      m.tensor_dim("blk." + std::to_string(hp.n_layer) + ".nextn.eh_proj.weight", 0) != kAnyDim)
    hp.n_nextn = nextn;
  // llama.cpp's default gating where the file names none: sigmoid for GLM-4.7-Flash (47 or 48
  // trunk layers and its vocabulary of 154,880; its converter writes no expert_gating_func),
  // softmax for the DeepSeek-V2 and V2.5 GGUFs written before the key existed.
  bool sigmoid_default = sigmoid_default_;
  if (glm_lite_default_ && glm_lite_shape(hp.n_layer, 154880)) {  // the depth first: no vocab read
    int n_vocab = 0;
    m.u("vocab_size", n_vocab, 0);
    if (n_vocab == 0)
      if (auto tokens = m.file().get_string_array("tokenizer.ggml.tokens"))
        n_vocab = int(tokens->size());
    sigmoid_default = sigmoid_default || glm_lite_shape(hp.n_layer, n_vocab);
  }
  route_ = read_routing(m, hp, /*norm_default=*/false, sigmoid_default);
  m.u("attention.q_lora_rank", q_lora_, 0);
  m.u("attention.kv_lora_rank", kv_lora_);
  m.u("attention.key_length_mla", k_mla_);
  m.u("attention.value_length_mla", v_mla_);
  int n_shared = 0;
  m.u("expert_shared_count", n_shared, 0);
  if (n_shared > 0) {  // the shared experts as one FFN, n_shared times an expert's width
    n_ff_shexp_ =
        m.tensor_dim("blk." + std::to_string(n_dense_lead_) + ".ffn_gate_shexp.weight", 1);
    if (n_ff_shexp_ == kAnyDim) n_ff_shexp_ = hp.n_ff_exp * n_shared;
  }
  if (n_dense_lead_ > 0) n_ff_ = width(m, "blk.0.ffn_gate.weight", 1, "feed_forward_length");
  if (!m.error().empty()) return;
  if (hp.n_head_kv != 1 || hp.head_dim != kv_lora_ + hp.n_rot || k_mla_ <= hp.n_rot || v_mla_ <= 0)
    return m.fail(
        "inconsistent multi-head latent attention sizes (a GGUF from an older llama.cpp with a "
        "joint "
        "attn_kv_b? re-convert it)");
  if (n_dense_lead_ > hp.n_layer) return m.fail("leading_dense_block_count exceeds block_count");
  // Mistral Large 3's query temperature (Llama 4's): llama.cpp reads these two keys.
  m.f("attention.temperature_scale", temp_.scale, 0.0f);
  m.u("attention.temperature_length", temp_.length, 0);
  if (temp_ && temp_.length <= 0)
    return m.fail("attention.temperature_scale needs a positive attention.temperature_length");
  // DeepSeek's YaRN: RoPE's cos/sin keep the original attention factor (1), and the attention
  // scale takes mscale^2 with mscale = 1 + yarn_log_multiplier * ln(factor), the GGUF key
  // holding 0.1 * mscale_all_dim (DeepSeek's yarn_get_mscale). Checked against llama.cpp as
  // llama-cpp-python 0.3.36 builds it on a synthetic DeepSeek-V2-Lite with factor 40: same
  // agreement as without scaling. (Newer llama.cpp graphs multiply by another 0.1 and expect
  // the key written differently; a GGUF from such a converter would be off here.)
  yarn_ = read_yarn(m, hp, yarn_ok_);
  if (yarn_) {
    float attn_factor = 1.0f, log_mul = 0.0f, factor = 1.0f;
    m.f("rope.scaling.yarn_attn_factor", attn_factor, 1.0f);
    m.f("rope.scaling.yarn_log_multiplier", log_mul, 0.0f);
    m.f("rope.scaling.factor", factor, 1.0f);
    yarn_->mscale = attn_factor;
    mscale_ = attn_factor * (1.0f + log_mul * std::log(factor));
  }
}

void Deepseek2::plan(const Hparams& hp, Plan& p) {
  hp_ = hp;
  const int64_t n_embd = hp.n_embd, n_head = hp.n_head, n_rot = hp.n_rot, qk_nope = k_mla_ - n_rot;
  layers_.resize(hp.n_blocks());  // the NextN block's too, where an architecture runs it
  for (int il = 0; il < hp.n_blocks(); ++il) {
    Layer& w = layers_[il];
    p.blk(il);
    p.add(w.attn_norm, "attn_norm.weight", {n_embd}, Role::Norm);
    plan_mla(p, w.mla, n_embd, q_lora_, n_head * k_mla_, kv_lora_, n_rot);
    // per head: (qk_nope) -> (kv_lora)
    p.add(w.wk_b, "attn_k_b.weight", {qk_nope, kv_lora_, n_head});
    // per head: (kv_lora) -> (v_mla)
    p.add(w.wv_b, "attn_v_b.weight", {kv_lora_, v_mla_, n_head});
    p.add(w.wo, "attn_output.weight", {n_head * v_mla_, n_embd}, Role::AttnOut);
    if (il < n_dense_lead_) {
      p.add(w.ffn_norm, "ffn_norm.weight", {n_embd}, Role::Norm);
      plan_ffn(p, w.ffn, hp, n_ff_);
      continue;
    }
    p.add(w.moe.norm, "ffn_norm.weight", {n_embd}, Role::Norm);
    w.moe.route = route_;
    p.moe(w.moe, hp);
    if (n_ff_shexp_ > 0) plan_shared_expert(p, w.moe, hp, n_ff_shexp_, /*gated=*/false);
  }
}

void Deepseek2::block(Engine& e, int il, Act x) const {
  Ops& ops = e.ops();
  const Layer& w = layers_[il];
  Act h = ops.rms_norm(x, w.attn_norm, hp_.eps);
  // per token: the query, the latent (normalised) and the shared rotary key part
  const MlaQkv qkv = mla_project(ops, w.mla, h, kv_lora_, hp_.eps);
  ops.add(x, attend(ops, il, qkv, {}));
  ffn_part(e, il, x, h);
}

Act Deepseek2::attend(Ops& ops, int il, const MlaQkv& qkv, Act sel) const {
  const Layer& w = layers_[il];
  const int64_t n_rot = hp_.n_rot, latent_row = kv_lora_ + n_rot;
  const RopeOpts rope{hp_.rope_base, /*neox=*/false, yarn_ ? &*yarn_ : nullptr};
  ops.rope(qkv.kv, latent_row, kv_lora_, n_rot, rope);
  ops.rope(qkv.q, k_mla_, k_mla_ - n_rot, n_rot, rope);
  const MlaOpts mla{hp_.n_head,     kv_lora_, n_rot,
                    k_mla_ - n_rot, v_mla_,   mscale_ * mscale_ / std::sqrt(float(k_mla_)),
                    temp_};
  Act att = ops.alloc(qkv.q.rows, int64_t{hp_.n_head} * v_mla_);
  ops.attention_mla(il, qkv.q, qkv.kv, w.wk_b, w.wv_b, mla, att, sel);
  return ops.matmul(w.wo, att);
}

void Deepseek2::ffn_part(Engine& e, int il, Act x, Act h) const {
  Ops& ops = e.ops();
  const Layer& w = layers_[il];
  if (il < n_dense_lead_) {
    ops.rms_norm(x, w.ffn_norm, h, hp_.eps);
    Act y = ops.alloc(x.rows, hp_.n_embd);
    ops.ffn(w.ffn, h, y);
    ops.add(x, y);
    return;
  }
  ops.rms_norm(x, w.moe.norm, h, hp_.eps);
  ops.add(x, e.moe(il, w.moe, h));
}

expertd::Result<SynthModel> Deepseek2::synth(const std::string& preset, const SynthDims& d) const {
  if (preset == "glm-4.7-flash") return synth_glm_lite(d);
  const bool mistral = preset == "mistral-large-3";
  SynthSizes s = mistral ? SynthSizes{7168, 61, 128, 4, 4096, 128, 128, 192, 131072}
                         : SynthSizes{2048, 27, 64, 6, 1408, 16, 16, 192, 102400};
  int kv_lora = 512, qk_nope = 128, rope = 64, v_head = 128, n_ff = mistral ? 18432 : 10944;
  int q_lora = mistral ? 1536 : 0, temp_length = 8192;
  EXPERTD_TRY(apply_dims(s, d));
  if (d.given())
    kv_lora = s.n_embd, qk_nope = s.head_dim, rope = s.head_dim / 2, v_head = s.head_dim,
    n_ff = 2 * s.n_ff_exp, q_lora = mistral ? s.n_embd / 2 : 0, temp_length = 8;
  auto m = synth_base(s, mistral ? "tekken" : "deepseek-llm");
  if (!m) return m;
  // V2-Lite: a plain attn_q (no q_lora), one leading dense layer, two shared experts. The
  // absorbed-MLA keys of current llama.cpp: key/value_length describe the latent cache row,
  // key/value_length_mla a head's query-key and value sizes; one latent "KV head".
  m->u32["attention.head_count_kv"] = 1;
  m->u32["leading_dense_block_count"] = mistral ? 3 : 1;
  m->u32["expert_shared_count"] = mistral ? 1 : 2;
  m->u32["feed_forward_length"] = n_ff;
  synth_mla(*m, {q_lora, kv_lora, qk_nope, rope, v_head});
  m->f32["expert_weights_scale"] = 1.0f;
  if (mistral) {
    if (d.layers > 0 && d.layers <= 3) m->u32["leading_dense_block_count"] = d.layers - 1;
    if (d.given()) m->u32["leading_dense_block_count"] = 1;
    m->u32["expert_gating_func"] = 1;  // softmax
    m->flags["expert_weights_norm"] = true;
    m->f32["attention.temperature_scale"] = 0.1f;
    m->u32["attention.temperature_length"] = temp_length;
    m->strings["rope.scaling.type"] = "yarn";
    m->f32["rope.scaling.factor"] = d.given() ? 4.0f : 32.0f;
    m->u32["rope.scaling.original_context_length"] = d.given() ? 64 : 8192;
    m->f32["rope.scaling.yarn_log_multiplier"] = 0.1f;
    m->f32["rope.scaling.yarn_beta_fast"] = 32.0f;
    m->f32["rope.scaling.yarn_beta_slow"] = 1.0f;
    m->u32["context_length"] = d.given() ? 256 : 262144;
    m->specials = {"<s>",
                   "[INST]",
                   "[/INST]",
                   "[TOOL_CALLS]",
                   "[AVAILABLE_TOOLS]",
                   "[/AVAILABLE_TOOLS]",
                   "[TOOL_RESULTS]",
                   "[/TOOL_RESULTS]",
                   "[SYSTEM_PROMPT]",
                   "[/SYSTEM_PROMPT]"};
  }
  return m;
}

// GLM-4.7-Flash (30B, 3B active; zai-org/GLM-4.7-Flash's config.json, Glm4MoeLiteForCausalLM,
// which llama.cpp's converter writes as deepseek2): n_embd 2,048, 47 layers (the first dense, of
// 10,240), 20 heads, q/kv LoRA 768/512, nope/rope/v 192/64/256, 64 routed experts of 1,536
// (top-4, sigmoid with the selection bias, renormalised, scale 1.8, one group), one shared
// expert, rope base 1,000,000, RMS epsilon 1e-5, a 202,752 context, the glm4 pre-tokenizer over
// 154,880 tokens, and its one MTP layer after the trunk (block_count 48, nextn_predict_layers 1).
// Like the converter it writes no expert_gating_func: llama.cpp's loader takes sigmoid from the
// depth and the vocabulary. A test size that is not 47 or 48 layers of that vocabulary says
// sigmoid (2), which the rule would not give it. --dims scales it as DeepSeek-V2's, keeping the
// query LoRA (llama.cpp's MTP graph needs it).
expertd::Result<SynthModel> Deepseek2::synth_glm_lite(const SynthDims& d) const {
  SynthSizes s{2048, 47, 64, 4, 1536, 20, 20, 256, 154880};
  s.rope_base = 1000000.0f, s.eps = 1e-5f;
  int q_lora = 768, kv_lora = 512, qk_nope = 192, rope = 64, v_head = 256, n_ff = 10240;
  EXPERTD_TRY(apply_dims(s, d));
  if (d.given())
    q_lora = s.n_embd / 2, kv_lora = s.n_embd, qk_nope = s.head_dim, rope = s.head_dim / 2,
    v_head = s.head_dim, n_ff = 2 * s.n_ff_exp;
  const int trunk = d.layers > 0 ? std::min<int>(s.n_layer, int(d.layers)) : s.n_layer;
  auto m = synth_base(s, "glm4");
  if (!m) return m;
  m->u32["attention.head_count_kv"] = 1;
  m->u32["leading_dense_block_count"] = 1;
  m->u32["expert_shared_count"] = 1;
  m->u32["feed_forward_length"] = n_ff;
  synth_mla(*m, {q_lora, kv_lora, qk_nope, rope, v_head});
  if (!glm_lite_shape(trunk, s.n_vocab)) m->u32["expert_gating_func"] = 2;
  m->flags["expert_weights_norm"] = true;
  m->f32["expert_weights_scale"] = 1.8f;
  m->u32["expert_group_count"] = 1;
  m->u32["expert_group_used_count"] = 1;
  m->u32["context_length"] = 202752;
  m->u32["block_count"] += 1;  // the MTP layer
  m->u32["nextn_predict_layers"] = 1;
  m->specials = glm_specials();
  return m;
}

}  // namespace archs

std::unique_ptr<Arch> make_arch_deepseek2() {
  return std::make_unique<archs::Deepseek2>();
}

}  // namespace engine
