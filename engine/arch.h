// An architecture is one file in engine/archs/ (as llama.cpp's src/models/<arch>.cpp): its
// hyper-parameters read from the GGUF metadata, its tensor plan (names, shapes, roles, bound to
// the fields of its own weights) and its forward pass, one block at a time, written against the
// engine's ops (engine/ops.h). Shared code never asks which architecture it runs.
//
// Adding one: a file engine/archs/<name>.cpp defining a class derived from Arch and a factory,
// and one line in engine/archs/list.h.
#pragma once

#include <array>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/result.h"
#include "engine/model.h"
#include "engine/ops.h"

namespace engine {

class Engine;

// What a tensor is for: the loader checks norms, biases and routers are F32; expert-pack synth
// picks initial values by role; the pack builder and the daemon path find routed experts by it.
enum class Role : uint8_t {
  Weight,
  Norm,
  Bias,
  Embedding,
  Router,
  AttnOut,
  ExpertGate,
  ExpertUp,
  ExpertDown,
  ExpertBias,
  Index,  // I32 ids below TensorSpec::index_limit (DeepSeek-V4's hash-routing table)
  Decay,  // F32 negative rates (the gated delta-net's -exp(A_log)): synthetic ones are negative
  RopeFactors  // F32 rope frequency factors (rope_freqs): synthetic ones rise from 1 to 4
};

// Whether tensors of this role are F32 (the loader checks it; expert-pack synth writes them so).
bool f32_role(Role r);

struct TensorSpec {
  std::string name;
  std::vector<int64_t> ne;
  Role role = Role::Weight;
  bool optional = false;
  bool synth =
      true;  // written into synthetic models (optional tensors: where the real models have them)
  Tensor* dst = nullptr;
  int layer = -1;           // -1 outside the blocks
  int64_t index_limit = 0;  // Role::Index: every value is in [0, index_limit)
};

// The tensor plan being built: add() binds a field to a name and shape; in a block (blk(il)),
// names are relative to "blk.<il>.".
class Plan {
 public:
  void blk(int il) { layer_ = il; }
  void add(Tensor& dst, const std::string& name, std::vector<int64_t> ne, Role role = Role::Weight);
  void optional(Tensor& dst, const std::string& name, std::vector<int64_t> ne,
                Role role = Role::Weight, bool synth = false);
  // An I32 table of ids in [0, limit): each row `ne[0]` distinct ones.
  void index(Tensor& dst, const std::string& name, std::vector<int64_t> ne, int64_t limit);
  // The routed-expert block of an MoE layer, llama.cpp's names (ffn_gate_inp, ffn_*_exps, ...),
  // with w.route already set (sigmoid or sqrt-softplus gating: synthetic models get a selection
  // bias). `hashed`: experts chosen by the token's row of ffn_gate_tid2eid, no selection bias.
  void moe(MoeWeights& w, const Hparams& hp, bool expert_biases = false, bool hashed = false);
  const std::vector<TensorSpec>& specs() const { return specs_; }

 private:
  std::vector<TensorSpec> specs_;
  int layer_ = -1;
};

// Reads "<arch>.<key>" metadata into fields; a missing required key or an implausible value is
// remembered as the first error, naming the file and the key.
class Meta {
 public:
  Meta(const gguf::Model& f, std::string arch) : f_(f), prefix_(std::move(arch) + ".") {}
  void u(const std::string& key, int& v);                // required
  void u(const std::string& key, int& v, int fallback);  // optional
  void f(const std::string& key, float& v, float fallback);
  void b(const std::string& key, bool& v, bool fallback);
  // A per-layer value: an array of n_layer numbers, or one number for every layer (required).
  void per_layer(const std::string& key, int n_layer, std::vector<int>& v);
  std::string s(const std::string& key, const std::string& fallback) const;
  bool has(const std::string& key) const;
  int64_t tensor_dim(const std::string& tensor, int d) const;  // kAnyDim when the file lacks it
  void fail(const std::string& why);  // an inconsistency found by the architecture
  const std::string& error() const { return err_; }
  const gguf::Model& file() const { return f_; }
  const std::string& prefix() const { return prefix_; }  // "<arch>."

 private:
  const gguf::Model& f_;
  std::string prefix_, err_;
};

// What expert-pack synth writes for a preset besides the tensors: the architecture's metadata
// (keys without the "<arch>." prefix) and the tokenizer's pre-tokenizer. The tensors come from
// the architecture's plan applied to this metadata, as for a real file.
struct SynthModel {
  std::string pre = "qwen2";
  int n_vocab = 0;
  std::map<std::string, uint32_t> u32;
  std::map<std::string, float> f32;
  std::map<std::string, bool> flags;
  std::map<std::string, std::string> strings;
  std::map<std::string, std::vector<int32_t>> arrays;  // per-layer values
  std::map<std::string, std::vector<float>> farrays;
  std::vector<std::string> specials;  // control tokens of the model's chat format
  // The trunk block whose tensors the NextN blocks (nextn_predict_layers) repeat, beside their
  // own; -1: the trunk's last.
  int nextn_like = -1;
  std::string nextn_out_norm = "nextn.shared_head_norm.weight";  // their final norm's name
  // Names (after blk.N.) that start the trunk block's tensors the NextN blocks leave out.
  std::vector<std::string> nextn_drop;
  // The NextN blocks' q, k and v projections as one attn_qkv (MiMo-V2's), and the trunk block
  // whose FFN (its ffn_* tensors) they take instead of nextn_like's (-1: nextn_like's).
  bool nextn_fused_qkv = false;
  int nextn_ffn_like = -1;
};
// --dims: n_embd, n_layer, n_expert, n_expert_used, n_ff_exp[, n_head, n_head_kv[, n_vocab]].
struct SynthDims {
  std::vector<uint64_t> dims;
  uint32_t layers = 0;  // --layers: the depth the model is cut to (0: the preset's)
  bool given() const { return !dims.empty(); }
};

class Arch {
 public:
  virtual ~Arch() = default;
  // The shared hyper-parameters into hp, the architecture's own into itself. Also sets how many
  // blocks run (hp.n_layer: trailing multi-token-prediction blocks are not).
  virtual void read_hparams(Meta& meta, Hparams& hp) = 0;
  // Every tensor of the blocks (the embeddings and output are the engine's), with shapes from hp.
  virtual void plan(const Hparams& hp, Plan& plan) = 0;
  // Layer il's attention cache for a context of n_ctx positions.
  virtual KvRows kv_rows(const Hparams& hp, int il, int n_ctx) const = 0;
  virtual const MoeWeights* moe(int il) const = 0;  // nullptr for a dense layer
  // One block on the residual stream x (n_tokens x residual_cols), in place.
  virtual void block(Engine& e, int il, Act x) const = 0;
  // The residual stream's width: n_embd, or DeepSeek-V4's hyper-connection streams side by side.
  virtual int64_t residual_cols(const Hparams& hp) const { return hp.n_embd; }
  // Before the first block: the residual stream from the embeddings (n_tokens x n_embd; the
  // stream itself when it is as wide). After the last: the rows the output norm reads (n_embd
  // wide). What an architecture keeps across the blocks of one eval (Kimi-K3's residual
  // checkpoints) is allocated here, in the engine's carried() activations, which live until the
  // eval ends.
  virtual void begin_eval(Engine& e, Act emb, Act x) const { (void)e, (void)emb, (void)x; }
  virtual Act end_eval(Engine& e, Act x) const {
    (void)e;
    return x;
  }
  // NextN drafting (engine/nextn.cpp), on the architectures that run their NextN block (they set
  // hp.n_nextn in read_hparams). The trunk's hidden row the block reads (nextn_cols wide) from the
  // residual stream after the blocks (x) and end_eval's rows (out); the block's residual stream
  // (residual_cols wide) from a token's embedding and such a row; the rows its head reads, and the
  // hidden row its next draft reads, from the stream after the block. The defaults are GLM-4.5's
  // (llama.cpp's glm4-moe graph_mtp): the output-normed final row; eh_proj([enorm(embedding),
  // hnorm(hidden)]); shared_head_norm (or output_norm), whose rows are also the next hidden.
  virtual int64_t nextn_cols(const Hparams& hp) const { return hp.n_embd; }
  // The head's norm (after blk.N.; optional: output_norm where the file lacks it).
  virtual std::string nextn_head_norm() const { return "nextn.shared_head_norm.weight"; }
  // Where that is absent, this one (empty: none); output_norm where both are.
  virtual std::string nextn_alt_head_norm() const { return ""; }
  // Whether the NextN blocks chain (llama.cpp's chain_heads, MiMo-V2 and Step-3.5): every block
  // is caught up on each eval, draft i comes from block i run over the pending token and the
  // drafts before it (each with the hidden row the step before produced), and there are at most
  // as many drafts as blocks. Otherwise only the first block drafts, one token a step.
  virtual bool nextn_chain() const { return false; }
  virtual Act nextn_hidden(Engine& e, const Model& m, Act x, Act out) const;
  virtual Act nextn_input(Engine& e, const Model& m, const NextnWeights& w, Act emb, Act h) const;
  virtual Act nextn_head(Engine& e, const Model& m, const NextnWeights& w, Act x,
                         Act* next_hidden) const;
  // The residual stream as the next layers' routers would read it before their norms (what the
  // prefetcher predicts from): the stream itself, or a reduction of a wide one.
  virtual Act router_stream(Engine& e, Act x) const {
    (void)e;
    return x;
  }
  // expert-pack synth: the real models this architecture imitates, and one's metadata (sizes
  // changed by --dims when given).
  virtual std::vector<std::string> synth_presets() const { return {}; }
  virtual expertd::Result<SynthModel> synth(const std::string& preset,
                                            const SynthDims& dims) const {
    (void)preset, (void)dims;
    return expertd::make_error("no synthetic presets");
  }
};

// A NextN block's head norm: shared_head_norm, the architecture's other name for it, or
// output_norm.
const Tensor& head_norm(const Model& m, const NextnWeights& w);

// The registered architectures (engine/archs/list.h): nullptr for an unknown name.
std::unique_ptr<Arch> make_arch(const std::string& name);
std::vector<std::string> arch_names();
std::string supported_archs();

// The tensor plan of a file (its metadata read by its architecture), without loading anything:
// what expert-pack synth writes. The specs' dst are null.
expertd::Result<std::vector<TensorSpec>> plan_tensors(const gguf::Model& file);

}  // namespace engine
