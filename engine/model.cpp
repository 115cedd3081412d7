#include "engine/model.h"

#include <cmath>

#include "engine/arch.h"
#include "kernels/kernels.h"

namespace engine {

using expertd::make_error;
using expertd::Result;

Model::Model() = default;
Model::Model(Model&&) noexcept = default;
Model& Model::operator=(Model&&) noexcept = default;
Model::~Model() = default;

const MoeWeights* Model::moe(int il) const {
  return arch->moe(il);
}

bool Model::is_routed_experts(const Tensor& t) const {
  for (int il = 0; il < hp.n_blocks(); ++il)
    if (const MoeWeights* w = moe(il))
      for (const Tensor* e : {&w->gate_exps, &w->up_exps, &w->down_exps, &w->gate_exps_b,
                              &w->up_exps_b, &w->down_exps_b})
        if (e->data == t.data) return true;
  return false;
}

bool f32_role(Role r) {
  return r == Role::Norm || r == Role::Bias || r == Role::Router || r == Role::ExpertBias ||
         r == Role::Decay || r == Role::RopeFactors;
}

namespace {

bool expert_role(Role r) {
  return r == Role::ExpertGate || r == Role::ExpertUp || r == Role::ExpertDown ||
         r == Role::ExpertBias;
}
std::string shape_text(const std::vector<int64_t>& ne) {
  std::string s = "[";
  for (size_t d = 0; d < ne.size(); ++d) s += (d ? ", " : "") + std::to_string(ne[d]);
  return s + "]";
}

// Binds one planned tensor to the file's; an empty error string when it is absent.
expertd::Status bind(const gguf::Model& f, const TensorSpec& s, const gguf::TensorInfo& ti) {
  const uint32_t type = static_cast<uint32_t>(ti.type);
  const auto* tr = gguf::type_traits(type);
  const std::string type_name(tr ? tr->name : "?");
  if (f32_role(s.role) && type != kernels::F32)
    return make_error(f.path() + ": tensor " + s.name + " has type " + type_name +
                      ", expected F32");
  if (s.role == Role::Index && type != kernels::I32)
    return make_error(f.path() + ": tensor " + s.name + " has type " + type_name +
                      ", expected I32");
  if (s.role != Role::Index && !kernels::weight_type_supported(type))
    return make_error(f.path() + ": tensor " + s.name + " has type " + type_name +
                      ", which the engine does not support (" + kernels::supported_type_names() +
                      ")");
  if (ti.n_dims > 3 && ti.ne[3] != 1)  // a trailing 1 is a 3-D tensor (Kimi's conv filters)
    return make_error(f.path() + ": tensor " + s.name + " has " + std::to_string(ti.n_dims) +
                      " dimensions");
  for (size_t d = 0; d < 3; ++d) {
    const int64_t want = d < s.ne.size() ? s.ne[d] : 1;
    if (static_cast<int64_t>(ti.ne[d]) != want)
      return make_error(f.path() + ": tensor " + s.name + " has shape [" +
                        std::to_string(ti.ne[0]) + ", " + std::to_string(ti.ne[1]) + ", " +
                        std::to_string(ti.ne[2]) + "], expected " + shape_text(s.ne));
  }
  if (s.role == Role::Index) {
    const auto* v = reinterpret_cast<const int32_t*>(ti.data);
    for (uint64_t i = 0; i < ti.ne[0] * ti.ne[1]; ++i)
      if (v[i] < 0 || v[i] >= s.index_limit)
        return make_error(f.path() + ": tensor " + s.name + " holds " + std::to_string(v[i]) +
                          " at " + std::to_string(i) + ", outside [0, " +
                          std::to_string(s.index_limit) + ")");
  }
  Tensor& t = *s.dst;
  t.type = type;
  t.ne = {static_cast<int64_t>(ti.ne[0]), static_cast<int64_t>(ti.ne[1]),
          static_cast<int64_t>(ti.ne[2])};
  t.data = ti.data;
  return {};
}

}  // namespace

namespace {

// Reads the hyper-parameters and builds the tensor plan (bound to m's fields).
expertd::Status prepare(const gguf::Model& f, Model& m, Plan& plan, bool nextn) {
  m.file = &f;
  Hparams& hp = m.hp;
  hp.arch = f.arch();
  m.arch = make_arch(hp.arch);
  if (!m.arch)
    return make_error(f.path() + ": architecture '" + hp.arch +
                      "' is not supported (supported: " + supported_archs() + ")");
  Meta meta(f, hp.arch);
  m.arch->read_hparams(meta, hp);
  if (!meta.error().empty()) return make_error(meta.error());
  if (nextn && hp.n_nextn == 0) {
    const uint64_t n = f.get_uint(hp.arch + ".nextn_predict_layers").value_or(0);
    return make_error(
        f.path() + ": no NextN (multi-token prediction) block to draft with" +
        (n == 0 ? std::string(" (no " + hp.arch + ".nextn_predict_layers)")
                : " that this engine runs (" + hp.arch + " declares " + std::to_string(n) +
                      "; NextN drafting runs GLM-4.5's, GLM-4.7-Flash's, GLM-5's, Qwen3.5's, "
                      "Qwen3-Next's, "
                      "DeepSeek-V3.2's, Hy3's, Ling 3.0's, MiMo-V2's, Step-3.5's and "
                      "DeepSeek-V4's, the latter of compress ratio 0)"));
  }
  // llama.cpp drafts with the first NextN block, or chains them all (MiMo-V2, Step-3.5)
  if (!nextn || !m.arch->nextn_chain()) hp.n_nextn = nextn ? 1 : 0;
  if (hp.n_head <= 0 || hp.n_head_kv <= 0 || hp.n_head % hp.n_head_kv || hp.head_dim <= 0 ||
      hp.n_rot > hp.head_dim || hp.n_rot % 2 || hp.n_expert <= 0 || hp.n_expert_used <= 0 ||
      hp.n_expert_used > hp.n_expert || hp.n_layer <= 0 || hp.n_embd <= 0)
    return make_error(f.path() +
                      ": inconsistent hyper-parameters (heads, head size, experts or layers)");
  auto tokens = f.get_string_array("tokenizer.ggml.tokens");
  const gguf::TensorInfo* emb = f.tensor("token_embd.weight");
  hp.n_vocab = tokens ? static_cast<int>(tokens->size()) : emb ? static_cast<int>(emb->ne[1]) : 0;
  plan.add(m.tok_embd, "token_embd.weight", {hp.n_embd, hp.n_vocab}, Role::Embedding);
  plan.add(m.output_norm, "output_norm.weight", {hp.n_embd}, Role::Norm);
  plan.optional(m.output, "output.weight", {hp.n_embd, hp.n_vocab}, Role::Weight, /*synth=*/true);
  m.arch->plan(hp, plan);
  // The blocks' own tensors; the architecture planned their decoder blocks.
  m.nextn.resize(size_t(hp.n_nextn));  // before the plan takes their addresses
  for (int j = 0; j < hp.n_nextn; ++j) {
    NextnWeights& w = m.nextn[size_t(j)];
    plan.blk(hp.n_layer + j);
    plan.add(w.eh_proj, "nextn.eh_proj.weight", {2 * int64_t{hp.n_embd}, hp.n_embd});
    plan.add(w.enorm, "nextn.enorm.weight", {hp.n_embd}, Role::Norm);
    plan.add(w.hnorm, "nextn.hnorm.weight", {hp.n_embd}, Role::Norm);
    plan.optional(w.head_norm, m.arch->nextn_head_norm(), {hp.n_embd}, Role::Norm);
    if (!m.arch->nextn_alt_head_norm().empty())
      plan.optional(w.alt_head_norm, m.arch->nextn_alt_head_norm(), {hp.n_embd}, Role::Norm);
    plan.optional(w.head, "nextn.shared_head_head.weight", {hp.n_embd, hp.n_vocab});
    plan.optional(w.embed, "nextn.embed_tokens.weight", {hp.n_embd, hp.n_vocab}, Role::Embedding);
    plan.blk(-1);
  }
  return {};
}

}  // namespace

Result<std::vector<TensorSpec>> plan_tensors(const gguf::Model& f) {
  Model m;
  Plan plan;
  EXPERTD_TRY(prepare(f, m, plan, /*nextn=*/false));
  std::vector<TensorSpec> specs = plan.specs();
  for (TensorSpec& s : specs) s.dst = nullptr;
  return specs;
}

Result<Model> Model::load(const gguf::Model& f, bool nextn) {
  Model m;
  Plan plan;
  EXPERTD_TRY(prepare(f, m, plan, nextn));
  // Routed experts are all there (a whole GGUF) or none (a core GGUF: they come from expertd).
  size_t experts_planned = 0, experts_found = 0;
  for (const TensorSpec& s : plan.specs()) {
    const gguf::TensorInfo* ti = f.tensor(s.name);
    const bool expert = expert_role(s.role);
    experts_planned += expert && !s.optional;
    if (!ti) {
      if (!s.optional && !expert) return make_error(f.path() + ": missing tensor " + s.name);
      continue;
    }
    experts_found += expert && !s.optional;
    if (auto st = bind(f, s, *ti); !st) return st.error();
    s.dst->weight = static_cast<int32_t>(m.weights.size());
    m.weights.push_back(*s.dst);
  }
  if (!m.output) m.output = m.tok_embd;
  m.pack_model_id = std::string(f.get_string("expertpack.model_id").value_or(""));
  if (experts_found != 0 && experts_found != experts_planned)
    return make_error(f.path() + ": some MoE layers lack expert tensors");
  m.has_local_experts = experts_found != 0 || experts_planned == 0;
  if (experts_found == 0 && experts_planned != 0 && m.pack_model_id.empty())
    return make_error(
        f.path() + ": no expert tensors and no expertpack.model_id: not a model, nor a core GGUF");
  return m;
}

// --- Plan and Meta ---------------------------------------------------------------------------

void Plan::add(Tensor& dst, const std::string& name, std::vector<int64_t> ne, Role role) {
  TensorSpec s;
  s.name = layer_ < 0 ? name : "blk." + std::to_string(layer_) + "." + name;
  s.ne = std::move(ne), s.role = role, s.dst = &dst, s.layer = layer_;
  specs_.push_back(std::move(s));
}

void Plan::index(Tensor& dst, const std::string& name, std::vector<int64_t> ne, int64_t limit) {
  add(dst, name, std::move(ne), Role::Index);
  specs_.back().index_limit = limit;
}

void Plan::optional(Tensor& dst, const std::string& name, std::vector<int64_t> ne, Role role,
                    bool synth) {
  add(dst, name, std::move(ne), role);
  specs_.back().optional = true;
  specs_.back().synth = synth;
}

void Plan::moe(MoeWeights& w, const Hparams& hp, bool expert_biases, bool hashed) {
  const int64_t E = w.n_embd ? w.n_embd : hp.n_embd, X = hp.n_expert, F = hp.n_ff_exp;
  w.expert_biases = expert_biases;
  add(w.router, "ffn_gate_inp.weight", {hp.n_embd, X}, Role::Router);
  optional(w.router_b, "ffn_gate_inp.bias", {X}, Role::Bias);
  if (hashed)
    index(w.tid2eid, "ffn_gate_tid2eid.weight", {hp.n_expert_used, hp.n_vocab}, X);
  else
    optional(w.exp_probs_b, w.exp_probs_b_name, {X}, Role::Bias,
             /*synth=*/w.route.sigmoid || w.route.sqrt_softplus);
  add(w.gate_exps, "ffn_gate_exps.weight", {E, F, X}, Role::ExpertGate);
  add(w.up_exps, "ffn_up_exps.weight", {E, F, X}, Role::ExpertUp);
  add(w.down_exps, "ffn_down_exps.weight", {F, E, X}, Role::ExpertDown);
  if (expert_biases) {
    add(w.gate_exps_b, "ffn_gate_exps.bias", {F, X}, Role::ExpertBias);
    add(w.up_exps_b, "ffn_up_exps.bias", {F, X}, Role::ExpertBias);
    add(w.down_exps_b, "ffn_down_exps.bias", {E, X}, Role::ExpertBias);
  }
}

void Meta::u(const std::string& key, int& v) {
  auto x = f_.get_uint(prefix_ + key);
  if (!x) return fail("missing metadata " + prefix_ + key);
  if (*x > (1u << 30)) return fail("implausible " + prefix_ + key + " = " + std::to_string(*x));
  v = static_cast<int>(*x);
}

void Meta::u(const std::string& key, int& v, int fallback) {
  if (f_.get_uint(prefix_ + key)) return u(key, v);
  v = fallback;
}

void Meta::f(const std::string& key, float& v, float fallback) {
  v = static_cast<float>(f_.get_float(prefix_ + key).value_or(fallback));
}

void Meta::per_layer(const std::string& key, int n_layer, std::vector<int>& v) {
  v.assign(std::max(n_layer, 0), 0);
  if (auto x = f_.get_uint(prefix_ + key)) {
    if (*x > (1u << 30)) return fail("implausible " + prefix_ + key + " = " + std::to_string(*x));
    std::fill(v.begin(), v.end(), static_cast<int>(*x));
    return;
  }
  auto a = f_.get_number_array(prefix_ + key);
  if (!a) return fail("missing metadata " + prefix_ + key);
  if (a->size() != v.size())
    return fail(prefix_ + key + " has " + std::to_string(a->size()) + " values for " +
                std::to_string(n_layer) + " layers");
  for (size_t i = 0; i < v.size(); ++i) {
    if ((*a)[i] < 0 || (*a)[i] > double(1u << 30) || (*a)[i] != std::floor((*a)[i]))
      return fail("implausible " + prefix_ + key + "[" + std::to_string(i) + "]");
    v[i] = static_cast<int>((*a)[i]);
  }
}

void Meta::b(const std::string& key, bool& v, bool fallback) {
  v = f_.get_bool(prefix_ + key).value_or(fallback);
}

std::string Meta::s(const std::string& key, const std::string& fallback) const {
  return std::string(f_.get_string(prefix_ + key).value_or(fallback));
}

bool Meta::has(const std::string& key) const {
  return f_.find(prefix_ + key) != nullptr;
}

void Meta::fail(const std::string& why) {
  if (err_.empty()) err_ = f_.path() + ": " + why;
}

int64_t Meta::tensor_dim(const std::string& name, int d) const {
  const gguf::TensorInfo* t = f_.tensor(name);
  return t ? static_cast<int64_t>(t->ne[d]) : kAnyDim;
}

}  // namespace engine
