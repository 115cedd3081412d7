// A loaded model: the hyper-parameters every architecture shares, the tensors around the blocks
// (embeddings, output), and the architecture (engine/arch.h) that owns the blocks' weights and
// their forward pass. Weights are views into the memory-mapped GGUF (never copied).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/result.h"
#include "engine/tensor.h"
#include "gguf/gguf_reader.h"

namespace engine {

class Arch;

inline constexpr int64_t kAnyDim =
    -1;  // a tensor plan's "as the file has it" (widths read from the tensor)

struct Hparams {
  std::string arch;  // general.architecture
  int n_vocab = 0, n_embd = 0, n_layer = 0, n_ctx_train = 0;
  int n_head = 0, n_head_kv = 0, head_dim = 0, n_rot = 0;
  int n_expert = 0, n_expert_used = 0;
  // NextN (multi-token prediction) blocks loaded after the trunk's n_layer: blocks n_layer..
  // (0 unless the model is loaded with them; an architecture that runs them sets it to the
  // file's count in read_hparams).
  int n_nextn = 0;
  int n_blocks() const { return n_layer + n_nextn; }
  int64_t n_ff_exp = kAnyDim;  // one routed expert's width (read from its tensors when loading)
  float eps = 1e-6f, rope_base = 10000.f;
};

// Routing of one MoE layer (llama.cpp's variants): gate scores by softmax or sigmoid, the
// selection bias exp_probs_b, expert groups (keep the n_group_used groups whose two best
// selection scores sum highest), weights renormalised and scaled; or gpt-oss's top-k of the raw
// logits then a softmax over those k.
struct RouteOpts {
  bool sigmoid = false;
  bool sqrt_softplus = false;  // DeepSeek-V4: sqrt(softplus(logit))
  bool norm_topk = true;
  bool topk_then_softmax = false;
  // Llama 4: the (one) chosen expert's weight scales its input, not its output.
  bool weight_before = false;
  int n_group = 0, n_group_used = 0;
  float w_scale = 1.0f;
};

// The gated activation of an FFN or an expert, act(gate, up): silu(g) * u; gpt-oss's clamped
// swiglu (alpha 1.702, limit 7); Kimi-K3's situ, beta tanh(g / beta) sigmoid(g) times
// linear_beta tanh(u / linear_beta) (the up side plain when linear_beta <= 0); DeepSeek-V4's
// limited swiglu, silu(min(g, limit)) * clamp(u, -limit, limit); Step 3.5's clamped one,
// min(silu(g), limit) * clamp(u, -limit, limit).
enum class Activation { Swiglu, SwigluOai, Situ, SwigluLimit, SwigluClamp };
struct Glu {
  Activation kind = Activation::Swiglu;
  float beta = 1.0f, linear_beta = 0.0f;  // situ
  float limit = 0.0f;                     // swiglu limit
};

// The FFN of a MoE layer as the shared MoE block runs it (engine/moe.cpp).
struct MoeWeights {
  Tensor norm;  // the norm before it (the prefetcher applies it to the next layer's input)
  Tensor router, router_b;  // ffn_gate_inp: (n_embd) -> (n_expert), F32; optional bias
  Tensor exp_probs_b;       // selection bias (F32, n_expert), optional
  // Its name in the file after blk.N. (Hy3 names it exp_probs_b, without the suffix).
  const char* exp_probs_b_name = "exp_probs_b.bias";
  Tensor tid2eid;  // hash routing (DeepSeek-V4): I32 {n_expert_used, n_vocab}, each token's experts
  Tensor gate_exps, up_exps;      // (n_embd) -> (n_ff_exp) x n_expert; absent in a core GGUF
  Tensor down_exps;               // (n_ff_exp) -> (n_embd) x n_expert
  Tensor gate_exps_b, up_exps_b;  // per-expert biases (F32): (n_ff_exp) x n_expert
  Tensor down_exps_b;             // (n_embd) x n_expert
  Tensor gate_shexp, up_shexp;    // shared expert: (n_embd) -> (n_ff_shexp)
  Tensor down_shexp;              // (n_ff_shexp) -> (n_embd)
  Tensor shexp_gate;              // ffn_gate_inp_shexp: (n_embd) -> 1, sigmoid gate, optional
  RouteOpts route;
  Glu act;
  std::optional<Glu> shexp_act;  // the shared expert's, where not act (Step 3.5's own clamps)
  int64_t n_embd = 0;  // the experts' input and output width; 0: the model's (Kimi-K3: latent)
  bool expert_biases = false;  // the experts carry biases (the pack must have them)
};

struct FfnWeights {
  Tensor gate, up, down;  // (n_embd) -> (n_ff), (n_ff) -> (n_embd)
  Glu act;
};

// What a NextN block adds to a decoder block (llama.cpp's names, blk.<n_layer>.nextn.*): it
// drafts the token after next from the next token's embedding and the trunk's hidden row,
// eh_proj([enorm(embedding), hnorm(hidden)]) into the block, then its head.
struct NextnWeights {
  Tensor eh_proj;        // (2 n_embd) -> (n_embd)
  Tensor enorm, hnorm;   // (n_embd)
  Tensor head_norm;      // shared_head_norm, optional: output_norm otherwise
  Tensor alt_head_norm;  // the architecture's other name for it (Arch::nextn_alt_head_norm)
  Tensor head;           // shared_head_head, optional: the output otherwise
  Tensor embed;          // embed_tokens, optional: token_embd otherwise
};

struct Model {
  Hparams hp;
  std::unique_ptr<Arch> arch;
  Tensor tok_embd;     // (n_embd) x n_vocab
  Tensor output_norm;  // (n_embd)
  Tensor output;       // (n_embd) -> (n_vocab); token_embd when tied
  // The NextN blocks run (hp.n_nextn of them): the first, or every one where the architecture
  // chains them (Arch::nextn_chain).
  std::vector<NextnWeights> nextn;
  std::vector<Tensor> weights;     // every loaded tensor (the CUDA backend uploads these)
  bool has_local_experts = false;  // false for a core GGUF: experts come from expertd
  std::string pack_model_id;       // expertpack.model_id of a core GGUF
  const gguf::Model* file = nullptr;

  Model();
  Model(Model&&) noexcept;
  Model& operator=(Model&&) noexcept;
  ~Model();

  // The MoE weights of layer il, nullptr for a dense layer.
  const MoeWeights* moe(int il) const;
  // Whether t holds a layer's routed experts (or their biases): the tensors an expert source
  // serves, which the backends do not copy.
  bool is_routed_experts(const Tensor& t) const;
  // Checks every tensor's presence, type and shape; errors name the tensor and the file.
  // nextn: also the first NextN block (an error where the file has none this engine runs).
  static expertd::Result<Model> load(const gguf::Model& file, bool nextn = false);
};

}  // namespace engine
