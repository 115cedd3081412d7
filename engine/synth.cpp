#include "engine/synth.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "common/fd.h"
#include "engine/arch.h"
#include "gguf/gguf_reader.h"
#include "gguf/gguf_writer.h"
#include "kernels/kernels.h"
#include "pack/progress.h"
#include "pack/quantize.h"

namespace engine {

using namespace expertd;
using pack::gauss;
using pack::quantize_row;
using pack::random_blocks;
using pack::splitmix64;

namespace {

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
  if (cp < 0x80)
    s += static_cast<char>(cp);
  else
    s += static_cast<char>(0xC0 | (cp >> 6)), s += static_cast<char>(0x80 | (cp & 0x3F));
  return s;
}

void add_tokenizer(gguf::Writer& w, const SynthModel& s, const std::string& chat_template) {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<std::string> merges;
  for (int b = 0; b < 256; ++b) tokens.push_back(byte_token(b)), types.push_back(1);
  const size_t room = size_t(s.n_vocab) - std::min(size_t(s.n_vocab), s.specials.size() + 2);
  for (char a = 'a'; a <= 'z' && tokens.size() < room; ++a)
    for (char b = 'a'; b <= 'z' && tokens.size() < room; ++b) {
      tokens.push_back(std::string{a, b});
      types.push_back(1);
      merges.push_back(std::string{a, ' ', b});
    }
  for (size_t i = 0; i < s.specials.size() && tokens.size() + 2 < size_t(s.n_vocab); ++i) {
    tokens.push_back(s.specials[i]);
    types.push_back(3);  // control
  }
  while (tokens.size() + 1 < size_t(s.n_vocab)) {
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
  if (!chat_template.empty()) w.add_string("tokenizer.chat_template", chat_template);
}

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

struct Preset {
  std::string arch, name;
};

std::vector<Preset> presets() {
  std::vector<Preset> v;
  for (const std::string& a : arch_names())
    for (const std::string& p : make_arch(a)->synth_presets()) v.push_back({a, p});
  return v;
}

// llama.cpp's llama_ftype for a file mostly of `type` (it only reports it); 1024 = guessed.
uint32_t file_type(gguf::GgmlType t) {
  using G = gguf::GgmlType;
  switch (t) {
    case G::F32:
      return 0;
    case G::F16:
      return 1;
    case G::Q4_0:
      return 2;
    case G::Q4_1:
      return 3;
    case G::Q8_0:
      return 7;
    case G::Q5_0:
      return 8;
    case G::Q5_1:
      return 9;
    case G::Q2_K:
      return 10;
    case G::Q3_K:
      return 12;
    case G::Q4_K:
      return 15;
    case G::Q5_K:
      return 17;
    case G::Q6_K:
      return 18;
    case G::IQ2_XXS:
      return 19;
    case G::IQ2_XS:
      return 20;
    case G::IQ3_XXS:
      return 23;
    case G::IQ1_S:
      return 24;
    case G::IQ4_NL:
      return 25;
    case G::IQ3_S:
      return 26;
    case G::IQ2_S:
      return 28;
    case G::IQ4_XS:
      return 30;
    case G::IQ1_M:
      return 31;
    case G::BF16:
      return 32;
    case G::TQ1_0:
      return 36;
    case G::TQ2_0:
      return 37;
    case G::MXFP4:
      return 38;
    default:
      return 1024;
  }
}

void add_metadata(gguf::Writer& w, const std::string& arch, const std::string& name,
                  const SynthModel& m, gguf::GgmlType type, const std::string& chat_template) {
  w.add_string("general.architecture", arch);
  w.add_string("general.name", "expertd synthetic " + name);
  w.add_u32("general.alignment", 32);
  for (const auto& [k, v] : m.u32) w.add_u32(arch + "." + k, v);
  for (const auto& [k, v] : m.f32) w.add_f32(arch + "." + k, v);
  for (const auto& [k, v] : m.flags) w.add_bool(arch + "." + k, v);
  for (const auto& [k, v] : m.strings) w.add_string(arch + "." + k, v);
  for (const auto& [k, v] : m.arrays) w.add_i32_array(arch + "." + k, v);
  for (const auto& [k, v] : m.farrays) w.add_f32_array(arch + "." + k, v);
  w.add_u32("general.file_type", file_type(type));
  add_tokenizer(w, m, chat_template);
}

}  // namespace

std::string synth_preset_names() {
  std::string out;
  for (const auto& p : presets()) out += (out.empty() ? "" : ", ") + p.name;
  return out;
}

Result<uint64_t> write_synth(const SynthOptions& o) {
  // A preset gives the architecture and its shape; --dims (alone: the first preset's layout,
  // qwen3moe) overrides the main sizes, so a preset's architecture can be made small for tests.
  const auto all = presets();
  Preset p = all.front();
  if (!o.preset.empty()) {
    auto it =
        std::find_if(all.begin(), all.end(), [&](const Preset& x) { return x.name == o.preset; });
    if (it == all.end())
      return make_error("unknown preset '" + o.preset + "' (known: " + synth_preset_names() + ")");
    p = *it;
  } else if (o.dims.size() < 5) {
    return make_error(
        "synth needs --preset NAME or --dims n_embd,n_layer,n_expert,n_expert_used,n_ff_exp");
  }
  using G = gguf::GgmlType;
  for (G t : {o.type, o.gate_type.value_or(o.type), o.up_type.value_or(o.type),
              o.down_type.value_or(o.type)})
    if (!kernels::weight_type_supported(t))
      return make_error(
          "synth: weight type " + std::string(gguf::type_traits(t)->name) +
          " is not one the kernels run (they run: " + kernels::supported_type_names() + ")");
  auto arch = make_arch(p.arch);
  auto sm = arch->synth(p.name, {o.dims, o.layers});
  if (!sm) return sm.error();
  // NextN (multi-token-prediction) blocks, where the model has them, trail the trunk's blocks.
  const uint32_t nextn =
      sm->u32.count("nextn_predict_layers") ? sm->u32["nextn_predict_layers"] : 0;
  if (o.layers) {  // the trunk cut; the per-layer arrays (one value per block) cut with it
    const size_t n_all = sm->u32["block_count"], trunk = n_all - nextn;
    const size_t cut = std::min<size_t>(trunk, o.layers);
    sm->u32["block_count"] = uint32_t(cut + nextn);
    auto keep = [&](auto& v) {  // the cut trunk's values, then the NextN blocks'
      if (v.size() != n_all) return;
      v.erase(v.begin() + ptrdiff_t(cut), v.begin() + ptrdiff_t(trunk));
    };
    for (auto& [k, v] : sm->arrays) keep(v);
    for (auto& [k, v] : sm->farrays) keep(v);
  }
  const std::string name = o.preset.empty() ? "custom" : p.name;

  // The tensors are the architecture's plan for this metadata, read back as from any file: a
  // synthetic model and a real one of the architecture come from the same plan.
  const std::string meta_path = o.out_path + ".meta.tmp";
  {
    gguf::Writer mw(32);
    add_metadata(mw, p.arch, name, *sm, o.type, o.chat_template);
    auto mfd = open_file(meta_path, O_WRONLY | O_CREAT | O_TRUNC);
    if (!mfd) return mfd.error();
    auto h = mw.header();
    EXPERTD_TRY(pwrite_full(mfd->get(), h.data(), h.size(), 0, meta_path));
  }
  auto meta = gguf::Model::open(meta_path);
  ::unlink(meta_path.c_str());
  if (!meta) return meta.error();
  auto specs = plan_tensors(*meta);
  if (!specs) return make_error("synth " + name + ": " + specs.error().message);
  std::vector<TensorSpec> plan;
  for (const TensorSpec& t : *specs)
    if (!t.optional || t.synth) plan.push_back(t);
  // The NextN blocks as llama.cpp's converters write them: a decoder block like one of the trunk's
  // (attention and MoE: the last, or the architecture's choice) plus the nextn projection of
  // [embedding, hidden] and its norms. No engine here runs them and llama.cpp only to draft, so
  // they are written last: the trunk's tensors are drawn as in a file without them.
  if (nextn > 0) {
    const int trunk = int(sm->u32["block_count"] - nextn);
    const int last = sm->nextn_like >= 0 && sm->nextn_like < trunk ? sm->nextn_like : trunk - 1;
    const int ffn =
        sm->nextn_ffn_like >= 0 && sm->nextn_ffn_like < trunk ? sm->nextn_ffn_like : last;
    const int64_t n_embd = sm->u32["embedding_length"];
    const size_t n_plan = plan.size();
    auto starts = [](const std::string& name, size_t at, const std::string& p) {
      return name.compare(at, p.size(), p) == 0;
    };
    for (uint32_t j = 0; j < nextn; ++j) {
      const int il = trunk + int(j);
      const std::string to = "blk." + std::to_string(il) + ".";
      int64_t qkv = 0;  // the fused projection's width
      for (size_t i = 0; i < n_plan; ++i) {
        const int from = plan[i].layer;
        if (from < 0 || from >= trunk) continue;
        const size_t at = ("blk." + std::to_string(from) + ".").size();
        const std::string& name = plan[i].name;
        if (from != (starts(name, at, "ffn_") ? ffn : last)) continue;
        if (std::any_of(sm->nextn_drop.begin(), sm->nextn_drop.end(),
                        [&](const std::string& d) { return starts(name, at, d); }))
          continue;
        if (sm->nextn_fused_qkv && (starts(name, at, "attn_q.") || starts(name, at, "attn_k.") ||
                                    starts(name, at, "attn_v."))) {
          qkv += plan[i].ne[1];
          continue;
        }
        TensorSpec c = plan[i];
        c.name = to + name.substr(at), c.layer = il, c.dst = nullptr;
        plan.push_back(std::move(c));
      }
      auto add = [&](const std::string& n, std::vector<int64_t> ne, Role role) {
        TensorSpec c;
        c.name = to + n, c.ne = std::move(ne), c.role = role, c.layer = il;
        plan.push_back(std::move(c));
      };
      if (qkv > 0) add("attn_qkv.weight", {n_embd, qkv}, Role::Weight);
      add("nextn.eh_proj.weight", {2 * n_embd, n_embd}, Role::Weight);
      add("nextn.enorm.weight", {n_embd}, Role::Norm);
      add("nextn.hnorm.weight", {n_embd}, Role::Norm);
      add(sm->nextn_out_norm, {n_embd}, Role::Norm);
    }
  }

  gguf::Writer w(32);
  add_metadata(w, p.arch, name, *sm, o.type, o.chat_template);
  std::vector<gguf::GgmlType> types;
  for (const TensorSpec& t : plan) {
    std::vector<uint64_t> ne(t.ne.begin(), t.ne.end());
    G want = o.type;
    if (t.role == Role::ExpertGate) want = o.gate_type.value_or(want);
    if (t.role == Role::ExpertUp) want = o.up_type.value_or(want);
    if (t.role == Role::ExpertDown) want = o.down_type.value_or(want);
    // Embeddings are quantized from float rows (a shared direction in them steers routing):
    // types without a quantizer here keep them in Q8_0.
    if (t.role == Role::Embedding && !pack::has_quantizer(want)) want = G::Q8_0;
    types.push_back(t.role == Role::Index ? G::I32 : f32_role(t.role) ? G::F32 : fit(want, ne[0]));
    w.add_tensor(t.name, types.back(), ne);
  }

  auto fd = open_file(o.out_path + ".tmp", O_WRONLY | O_CREAT | O_TRUNC);
  if (!fd) return fd.error();
  struct Unlink {
    std::string p;
    ~Unlink() {
      if (!p.empty()) ::unlink(p.c_str());
    }
  } guard{o.out_path + ".tmp"};
  auto header = w.header();
  EXPERTD_TRY(pwrite_full(fd->get(), header.data(), header.size(), 0, o.out_path));

  uint64_t rng = o.seed * 0x2545F4914F6CDD1Dull + 1;
  // A shared direction in every embedding; router rows lean on it with Zipf(1) strength over a
  // per-layer random permutation, so a few experts are popular and most are rare.
  const uint64_t n_embd = sm->u32["embedding_length"];
  std::vector<float> dir(n_embd);
  for (auto& x : dir) x = gauss(rng) / std::sqrt(float(n_embd));
  pack::Progress progress("synth " + name, w.file_bytes(), o.progress);
  std::vector<uint8_t> buf;
  std::vector<float> row;
  uint64_t written = header.size();
  for (size_t i = 0; i < plan.size(); ++i) {
    const TensorSpec& t = plan[i];
    const gguf::GgmlType type = types[i];
    const uint64_t ne0 = static_cast<uint64_t>(t.ne[0]);
    const uint64_t rb = *gguf::row_bytes(type, ne0), rows = w.tensor_bytes(i) / rb;
    const float scale = t.role == Role::AttnOut      ? kAttnOutScale
                        : t.role == Role::ExpertDown ? kExpertOutScale
                                                     : 1.0f;
    const float std_dev = scale / std::sqrt(float(ne0));
    row.resize(ne0);
    uint64_t chunk_rows = std::max<uint64_t>(1, (16u << 20) / rb);
    for (uint64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
      uint64_t nr = std::min(chunk_rows, rows - r0);
      buf.resize(nr * rb);
      if (t.role == Role::Index) {  // each row: ne0 distinct ids below the limit
        std::vector<int32_t> ids(size_t(t.index_limit));
        for (uint64_t r = 0; r < nr; ++r) {
          std::iota(ids.begin(), ids.end(), 0);
          for (uint64_t k = 0; k < ne0; ++k)
            std::swap(ids[k], ids[k + splitmix64(rng) % (ids.size() - k)]);
          std::memcpy(buf.data() + r * rb, ids.data(), ne0 * sizeof(int32_t));
        }
      } else if (t.role != Role::Norm && t.role != Role::Embedding && t.role != Role::Router &&
                 t.role != Role::Decay && t.role != Role::RopeFactors) {
        random_blocks(type, buf.data(), buf.size(), std_dev, rng);
      } else {
        std::vector<uint32_t> perm(t.role == Role::Router ? t.ne[1] : 0);
        if (t.role == Role::Router) {
          std::iota(perm.begin(), perm.end(), 0u);
          uint64_t prng = o.seed * 977 + t.layer;
          for (size_t k = perm.size() - 1; k > 0; --k)
            std::swap(perm[k], perm[splitmix64(prng) % (k + 1)]);
        }
        for (uint64_t r = 0; r < nr; ++r) {
          for (uint64_t c = 0; c < ne0; ++c) {
            float x = t.role == Role::Norm ? 1.0f : gauss(rng) * std_dev;
            if (t.role == Role::Decay) x = -std::exp(gauss(rng) * 0.5f);  // as -exp(A_log)
            // llama3-style: 1 on the fast pairs up to 4 on the slow ones
            if (t.role == Role::RopeFactors)
              x = 1.0f + 3.0f * float(c) / float(std::max<uint64_t>(ne0 - 1, 1));
            // Embeddings at the scale of what the blocks add to the residual stream (norm
            // ~sqrt(n_embd)): at a smaller scale, attention's average over positions and the
            // experts' outputs swamp each token's own direction and every token routes alike.
            if (t.role == Role::Embedding)
              x = (x + 0.5f * dir[c]) * std::sqrt(float(n_embd));  // cosine ~0.45 with dir
            // The routed hidden state has norm sqrt(n_embd) and leans on `dir` (cosine ~0.5), and
            // the noise part of a router logit has std ~1: expert of rank r gets about
            // +kRouterSkew/(1+r) std, a Zipf(1) popularity that still routes to most experts.
            if (t.role == Role::Router && o.routing == SynthRouting::Zipf)
              x += 2.0f * kRouterSkew / std::sqrt(float(n_embd)) * dir[c] / float(1 + perm[r0 + r]);
            row[c] = x;
          }
          // Balanced: the router row has no part along `dir`, the direction every hidden state
          // shares, so no expert is favoured for all tokens; each token's own part routes it.
          if (t.role == Role::Router && o.routing == SynthRouting::Balanced) {
            double along = 0, norm = 0;
            for (uint64_t c = 0; c < ne0; ++c)
              along += double(row[c]) * dir[c], norm += double(dir[c]) * dir[c];
            for (uint64_t c = 0; c < ne0; ++c) row[c] -= float(along / norm) * dir[c];
          }
          quantize_row(type, {row.data(), ne0}, buf.data() + r * rb);
        }
      }
      EXPERTD_TRY(
          pwrite_full(fd->get(), buf.data(), buf.size(), w.tensor_offset(i) + r0 * rb, o.out_path));
      written += buf.size();
      progress.update(written);
    }
  }
  if (::ftruncate(fd->get(), static_cast<off_t>(w.file_bytes())) != 0)
    return errno_error("truncate " + o.out_path);
  progress.update(w.file_bytes());
  if (::rename((o.out_path + ".tmp").c_str(), o.out_path.c_str()) != 0)
    return errno_error("rename to " + o.out_path);
  guard.p.clear();
  return w.file_bytes();
}

}  // namespace engine
