#include "pack/synth.h"

#include <cmath>
#include <cstring>
#include <numeric>

#include "common/fd.h"
#include "gguf/gguf_writer.h"
#include "pack/progress.h"
#include "pack/quantize.h"

namespace expertd::pack {
namespace {

struct Shape {
  std::string name, arch, pre;
  uint64_t n_embd, n_layer, n_expert, n_expert_used, n_ff_exp, n_head, n_head_kv, head_dim, n_vocab;
  uint64_t n_ff_dense = 0, n_dense_lead = 0, n_ff_shexp = 0;  // deepseek2-style extras
  float rope_base = 10000, eps = 1e-6f;
  bool qk_norm = false;
  uint64_t rope_dims = 0;  // partial rotary (0: the whole head)
  // deepseek2 MLA
  uint64_t kv_lora = 0, qk_nope = 0, qk_rope = 0, v_head = 0;
};

std::vector<Shape> presets() {
  std::vector<Shape> p;
  p.push_back({"qwen3-30b-a3b", "qwen3moe", "qwen2", 2048, 48, 128, 8, 768, 32, 4, 128, 151936});
  p.back().rope_base = 1e6f, p.back().qk_norm = true;
  p.push_back({"mixtral-8x7b", "llama", "llama-bpe", 4096, 32, 8, 2, 14336, 32, 8, 128, 32000});
  p.back().rope_base = 1e6f, p.back().eps = 1e-5f;
  p.push_back({"olmoe-1b-7b", "olmoe", "olmo", 2048, 16, 64, 8, 1024, 16, 16, 128, 50304});
  p.back().eps = 1e-5f, p.back().qk_norm = true;
  Shape ds{"deepseek-v2-lite", "deepseek2", "deepseek-llm", 2048, 27, 64, 6, 1408, 16, 16, 192, 102400};
  ds.n_ff_dense = 10944, ds.n_dense_lead = 1, ds.n_ff_shexp = 2 * 1408;
  ds.kv_lora = 512, ds.qk_nope = 128, ds.qk_rope = 64, ds.v_head = 128;
  p.push_back(ds);
  // GLM-4.5-Air: q/k/v biases, half the head rotated, sigmoid gating with a selection bias.
  Shape glm{"glm-4.5-air", "glm4moe", "qwen2", 4096, 46, 128, 8, 1408, 96, 8, 128, 151552};
  glm.n_ff_dense = 10944, glm.n_dense_lead = 1, glm.n_ff_shexp = 1408, glm.rope_base = 1e6f, glm.eps = 1e-5f;
  glm.rope_dims = 64;
  p.push_back(glm);
  return p;
}

// GPT-2 byte-to-unicode: printable bytes map to themselves, the rest to U+0100 onwards.
std::string byte_token(int b) {
  bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
  int cp = b;
  if (!keep) {
    int n = 0;
    for (int x = 0; x < b; ++x)
      if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) ++n;
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) s += static_cast<char>(cp);
  else s += static_cast<char>(0xC0 | (cp >> 6)), s += static_cast<char>(0x80 | (cp & 0x3F));
  return s;
}

void add_tokenizer(gguf::Writer& w, const Shape& s) {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<std::string> merges;
  for (int b = 0; b < 256; ++b) tokens.push_back(byte_token(b)), types.push_back(1);
  for (char a = 'a'; a <= 'z' && tokens.size() + 2 < s.n_vocab; ++a)
    for (char b = 'a'; b <= 'z' && tokens.size() + 2 < s.n_vocab; ++b) {
      tokens.push_back(std::string{a, b});
      types.push_back(1);
      merges.push_back(std::string{a, ' ', b});
    }
  while (tokens.size() + 1 < s.n_vocab) {
    tokens.push_back("<|synth_" + std::to_string(tokens.size()) + "|>");
    types.push_back(4);  // user-defined: never produced by merges
  }
  tokens.push_back("<|endoftext|>");
  types.push_back(3);  // control
  uint32_t eos = static_cast<uint32_t>(tokens.size() - 1);
  w.add_string("tokenizer.ggml.model", "gpt2");
  w.add_string("tokenizer.ggml.pre", s.pre);
  w.add_string_array("tokenizer.ggml.tokens", tokens);
  w.add_i32_array("tokenizer.ggml.token_type", types);
  w.add_string_array("tokenizer.ggml.merges", merges);
  w.add_u32("tokenizer.ggml.bos_token_id", eos);
  w.add_u32("tokenizer.ggml.eos_token_id", eos);
  w.add_bool("tokenizer.ggml.add_bos_token", false);
}

struct TensorPlan {
  std::string name;
  gguf::GgmlType type;
  std::vector<uint64_t> ne;
  enum Kind { Random, Ones, Embedding, Router } kind = Random;
  uint32_t layer = 0;
  float scale = 1.0f;  // of the random values' std, 1/sqrt(row length) by default
};

// Random weights make attention near-uniform: its output is an average over positions, common to
// every token, and so are large parts of the experts' outputs. Kept small next to the embeddings,
// they leave each token's routed hidden state its own, and routing as diverse as a trained
// model's (calibrated against the bundled model's trace: see bench/routing in the README).
constexpr float kAttnOutScale = 0.25f, kExpertOutScale = 0.5f, kRouterSkew = 0.6f;

gguf::GgmlType fit(gguf::GgmlType want, uint64_t row) {
  if (gguf::row_bytes(want, row)) return want;
  if (gguf::row_bytes(gguf::GgmlType::Q8_0, row)) return gguf::GgmlType::Q8_0;
  return gguf::GgmlType::F16;
}

std::vector<TensorPlan> plan_tensors(const Shape& s, gguf::GgmlType t) {
  std::vector<TensorPlan> v;
  using G = gguf::GgmlType;
  auto mat = [&](std::string n, uint64_t in, uint64_t out) { v.push_back({n, fit(t, in), {in, out}}); };
  auto vec = [&](std::string n, uint64_t len) { v.push_back({n, G::F32, {len}, TensorPlan::Ones}); };
  v.push_back({"token_embd.weight", fit(t, s.n_embd), {s.n_embd, s.n_vocab}, TensorPlan::Embedding});
  vec("output_norm.weight", s.n_embd);
  mat("output.weight", s.n_embd, s.n_vocab);
  for (uint32_t l = 0; l < s.n_layer; ++l) {
    std::string p = "blk." + std::to_string(l) + ".";
    vec(p + "attn_norm.weight", s.n_embd);
    if (s.arch == "deepseek2") {
      mat(p + "attn_q.weight", s.n_embd, s.n_head * (s.qk_nope + s.qk_rope));
      mat(p + "attn_kv_a_mqa.weight", s.n_embd, s.kv_lora + s.qk_rope);
      vec(p + "attn_kv_a_norm.weight", s.kv_lora);
      v.push_back({p + "attn_k_b.weight", fit(t, s.qk_nope), {s.qk_nope, s.kv_lora, s.n_head}});
      v.push_back({p + "attn_v_b.weight", fit(t, s.kv_lora), {s.kv_lora, s.v_head, s.n_head}});
      mat(p + "attn_output.weight", s.n_head * s.v_head, s.n_embd);
    } else {
      mat(p + "attn_q.weight", s.n_embd, s.n_head * s.head_dim);
      mat(p + "attn_k.weight", s.n_embd, s.n_head_kv * s.head_dim);
      mat(p + "attn_v.weight", s.n_embd, s.n_head_kv * s.head_dim);
      if (s.arch == "glm4moe")
        for (auto [n, len] : {std::pair{"attn_q.bias", s.n_head * s.head_dim}, {"attn_k.bias", s.n_head_kv * s.head_dim},
                              {"attn_v.bias", s.n_head_kv * s.head_dim}})
          v.push_back({p + n, G::F32, {len}});
      mat(p + "attn_output.weight", s.n_head * s.head_dim, s.n_embd);
      v.back().scale = kAttnOutScale;
      if (s.qk_norm && s.arch == "olmoe") {
        vec(p + "attn_q_norm.weight", s.n_head * s.head_dim);
        vec(p + "attn_k_norm.weight", s.n_head_kv * s.head_dim);
      } else if (s.qk_norm) {
        vec(p + "attn_q_norm.weight", s.head_dim);
        vec(p + "attn_k_norm.weight", s.head_dim);
      }
    }
    vec(p + (s.arch == "glm4moe" ? "post_attention_norm.weight" : "ffn_norm.weight"), s.n_embd);
    if (l < s.n_dense_lead) {
      mat(p + "ffn_gate.weight", s.n_embd, s.n_ff_dense);
      mat(p + "ffn_up.weight", s.n_embd, s.n_ff_dense);
      mat(p + "ffn_down.weight", s.n_ff_dense, s.n_embd);
      continue;
    }
    v.push_back({p + "ffn_gate_inp.weight", G::F32, {s.n_embd, s.n_expert}, TensorPlan::Router, l});
    if (s.arch == "glm4moe") v.push_back({p + "exp_probs_b.bias", G::F32, {s.n_expert}});
    v.push_back({p + "ffn_gate_exps.weight", fit(t, s.n_embd), {s.n_embd, s.n_ff_exp, s.n_expert}});
    v.push_back({p + "ffn_up_exps.weight", fit(t, s.n_embd), {s.n_embd, s.n_ff_exp, s.n_expert}});
    v.push_back({p + "ffn_down_exps.weight", fit(t, s.n_ff_exp), {s.n_ff_exp, s.n_embd, s.n_expert}});
    v.back().scale = kExpertOutScale;
    if (s.n_ff_shexp) {
      mat(p + "ffn_gate_shexp.weight", s.n_embd, s.n_ff_shexp);
      mat(p + "ffn_up_shexp.weight", s.n_embd, s.n_ff_shexp);
      mat(p + "ffn_down_shexp.weight", s.n_ff_shexp, s.n_embd);
    }
  }
  return v;
}

void add_hparams(gguf::Writer& w, const Shape& s) {
  const std::string a = s.arch;
  w.add_string("general.architecture", a);
  w.add_string("general.name", "expertd synthetic " + s.name);
  w.add_u32("general.alignment", 32);
  w.add_u32(a + ".context_length", 4096);
  w.add_u32(a + ".embedding_length", static_cast<uint32_t>(s.n_embd));
  w.add_u32(a + ".block_count", static_cast<uint32_t>(s.n_layer));
  w.add_u32(a + ".feed_forward_length", static_cast<uint32_t>(s.n_dense_lead ? s.n_ff_dense : s.n_ff_exp));
  w.add_u32(a + ".expert_feed_forward_length", static_cast<uint32_t>(s.n_ff_exp));
  w.add_u32(a + ".attention.head_count", static_cast<uint32_t>(s.n_head));
  // MLA (current llama.cpp convention): one latent "KV head".
  w.add_u32(a + ".attention.head_count_kv", static_cast<uint32_t>(a == "deepseek2" ? 1 : s.n_head_kv));
  w.add_u32(a + ".expert_count", static_cast<uint32_t>(s.n_expert));
  w.add_u32(a + ".expert_used_count", static_cast<uint32_t>(s.n_expert_used));
  w.add_f32(a + ".rope.freq_base", s.rope_base);
  w.add_f32(a + ".attention.layer_norm_rms_epsilon", s.eps);
  if (a == "deepseek2") {
    w.add_u32(a + ".leading_dense_block_count", static_cast<uint32_t>(s.n_dense_lead));
    w.add_u32(a + ".expert_shared_count", 2);
    w.add_f32(a + ".expert_weights_scale", 1.0f);
    w.add_u32(a + ".attention.q_lora_rank", 0);  // V2-Lite: a plain attn_q
    w.add_u32(a + ".attention.kv_lora_rank", static_cast<uint32_t>(s.kv_lora));
    // llama.cpp's absorbed-MLA keys: key/value_length describe the latent cache row,
    // key/value_length_mla a head's query-key and value sizes.
    w.add_u32(a + ".attention.key_length", static_cast<uint32_t>(s.kv_lora + s.qk_rope));
    w.add_u32(a + ".attention.value_length", static_cast<uint32_t>(s.kv_lora));
    w.add_u32(a + ".attention.key_length_mla", static_cast<uint32_t>(s.qk_nope + s.qk_rope));
    w.add_u32(a + ".attention.value_length_mla", static_cast<uint32_t>(s.v_head));
    w.add_u32(a + ".rope.dimension_count", static_cast<uint32_t>(s.qk_rope));
  } else {
    w.add_u32(a + ".attention.key_length", static_cast<uint32_t>(s.head_dim));
    w.add_u32(a + ".attention.value_length", static_cast<uint32_t>(s.head_dim));
    w.add_u32(a + ".rope.dimension_count", static_cast<uint32_t>(s.rope_dims ? s.rope_dims : s.head_dim));
  }
  if (a == "glm4moe") {
    w.add_u32(a + ".leading_dense_block_count", static_cast<uint32_t>(s.n_dense_lead));
    w.add_u32(a + ".expert_shared_count", 1);
    w.add_f32(a + ".expert_weights_scale", 1.0f);
    w.add_bool(a + ".expert_weights_norm", true);
    w.add_u32(a + ".expert_gating_func", 2);  // sigmoid
    w.add_u32(a + ".nextn_predict_layers", 0);
  }
}

}  // namespace

std::string synth_preset_names() {
  std::string out;
  for (const auto& p : presets()) out += (out.empty() ? "" : ", ") + p.name;
  return out;
}

Result<uint64_t> write_synth(const SynthOptions& o) {
  // A preset gives the architecture and its shape; --dims (alone: the qwen3moe layout) overrides
  // the main sizes, so a preset's architecture can be made small for tests.
  Shape s = presets()[0];
  if (!o.preset.empty()) {
    bool found = false;
    for (const auto& p : presets())
      if (p.name == o.preset) s = p, found = true;
    if (!found) return make_error("unknown preset '" + o.preset + "' (known: " + synth_preset_names() + ")");
  } else if (o.dims.size() < 5) {
    return make_error("synth needs --preset NAME or --dims n_embd,n_layer,n_expert,n_expert_used,n_ff_exp");
  }
  if (!o.dims.empty()) {
    if (o.dims.size() < 5) return make_error("--dims needs at least n_embd,n_layer,n_expert,n_expert_used,n_ff_exp");
    if (o.preset.empty()) s.name = "custom";
    s.n_embd = o.dims[0], s.n_layer = o.dims[1], s.n_expert = o.dims[2], s.n_expert_used = o.dims[3];
    const uint64_t shared = s.n_ff_exp ? s.n_ff_shexp / s.n_ff_exp : 0;  // the preset's shared experts
    s.n_ff_exp = o.dims[4];
    if (o.dims.size() >= 7) s.n_head = o.dims[5], s.n_head_kv = o.dims[6];
    if (o.dims.size() >= 8) s.n_vocab = o.dims[7];
    if (s.n_head == 0 || s.n_embd % s.n_head) return make_error("--dims: n_embd must be a multiple of n_head");
    s.head_dim = s.n_embd / s.n_head;
    if (s.rope_dims) s.rope_dims = s.head_dim / 2;
    if (s.n_ff_dense) s.n_ff_dense = 2 * s.n_ff_exp;
    s.n_ff_shexp = shared * s.n_ff_exp;
    if (s.kv_lora) s.kv_lora = s.n_embd, s.qk_nope = s.head_dim, s.qk_rope = s.head_dim / 2, s.v_head = s.head_dim;
  }
  if (o.layers) s.n_layer = std::min<uint64_t>(s.n_layer, o.layers);
  if (s.n_expert_used > s.n_expert || s.n_expert < 2 || s.n_vocab < 300 || s.n_head_kv == 0 ||
      s.n_head % s.n_head_kv || s.n_embd % 32)
    return make_error("synth: inconsistent dimensions");
  using G = gguf::GgmlType;
  if (o.type != G::Q4_K && o.type != G::Q8_0 && o.type != G::F16)
    return make_error("synth: --type must be Q4_K, Q8_0 or F16");

  gguf::Writer w(32);
  add_hparams(w, s);
  w.add_u32("general.file_type", o.type == G::Q4_K ? 15 : o.type == G::Q8_0 ? 7 : 1);
  add_tokenizer(w, s);
  auto plan = plan_tensors(s, o.type);
  for (const auto& t : plan) w.add_tensor(t.name, t.type, t.ne);

  auto fd = open_file(o.out_path + ".tmp", O_WRONLY | O_CREAT | O_TRUNC);
  if (!fd) return fd.error();
  struct Unlink {
    std::string p;
    ~Unlink() { if (!p.empty()) ::unlink(p.c_str()); }
  } guard{o.out_path + ".tmp"};
  auto header = w.header();
  EXPERTD_TRY(pwrite_full(fd->get(), header.data(), header.size(), 0, o.out_path));

  uint64_t rng = o.seed * 0x2545F4914F6CDD1Dull + 1;
  // A shared direction in every embedding; router rows lean on it with Zipf(1) strength over a
  // per-layer random permutation, so a few experts are popular and most are rare.
  std::vector<float> dir(s.n_embd);
  for (auto& x : dir) x = gauss(rng) / std::sqrt(float(s.n_embd));
  Progress progress("synth " + s.name, w.file_bytes(), o.progress);
  std::vector<uint8_t> buf;
  std::vector<float> row(s.n_embd);
  uint64_t written = header.size();
  for (size_t i = 0; i < plan.size(); ++i) {
    const auto& t = plan[i];
    uint64_t bytes = w.tensor_bytes(i), rows = bytes / *gguf::row_bytes(t.type, t.ne[0]);
    uint64_t rb = *gguf::row_bytes(t.type, t.ne[0]);
    float std_dev = t.scale / std::sqrt(float(t.ne[0]));
    uint64_t chunk_rows = std::max<uint64_t>(1, (16u << 20) / rb);
    for (uint64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
      uint64_t nr = std::min(chunk_rows, rows - r0);
      buf.resize(nr * rb);
      if (t.kind == TensorPlan::Random) {
        random_blocks(t.type, buf.data(), buf.size(), std_dev, rng);
      } else {
        std::vector<uint32_t> perm(s.n_expert);
        if (t.kind == TensorPlan::Router) {
          std::iota(perm.begin(), perm.end(), 0u);
          uint64_t prng = o.seed * 977 + t.layer;
          for (size_t k = perm.size() - 1; k > 0; --k) std::swap(perm[k], perm[splitmix64(prng) % (k + 1)]);
        }
        for (uint64_t r = 0; r < nr; ++r) {
          for (uint64_t c = 0; c < t.ne[0]; ++c) {
            float x = t.kind == TensorPlan::Ones ? 1.0f : gauss(rng) * std_dev;
            // Embeddings at the scale of what the blocks add to the residual stream (norm ~sqrt(n_embd)):
            // at a smaller scale, attention's average over positions and the experts' outputs
            // swamp each token's own direction and every token routes alike.
            if (t.kind == TensorPlan::Embedding) x = (x + 0.5f * dir[c]) * std::sqrt(float(s.n_embd));  // cosine ~0.45 with dir
            // The routed hidden state has norm sqrt(n_embd) and leans on `dir` (cosine ~0.5), and
            // the noise part of a router logit has std ~1: expert of rank r gets about
            // +kRouterSkew/(1+r) std, a Zipf(1) popularity that still routes to most experts.
            if (t.kind == TensorPlan::Router) x += 2.0f * kRouterSkew / std::sqrt(float(s.n_embd)) * dir[c] / float(1 + perm[r0 + r]);
            row[c] = x;
          }
          quantize_row(t.type, {row.data(), t.ne[0]}, buf.data() + r * rb);
        }
      }
      EXPERTD_TRY(pwrite_full(fd->get(), buf.data(), buf.size(), w.tensor_offset(i) + r0 * rb, o.out_path));
      written += buf.size();
      progress.update(written);
    }
  }
  if (::ftruncate(fd->get(), static_cast<off_t>(w.file_bytes())) != 0) return errno_error("truncate " + o.out_path);
  progress.update(w.file_bytes());
  if (::rename((o.out_path + ".tmp").c_str(), o.out_path.c_str()) != 0) return errno_error("rename to " + o.out_path);
  guard.p.clear();
  return w.file_bytes();
}

}  // namespace expertd::pack
