// What architecture files read and plan alike (llama.cpp's metadata keys and tensor names).
// Helpers only: each architecture's file still states its own tensors and forward pass.
#pragma once

#include <cmath>
#include <optional>

#include "engine/arch.h"
#include "engine/engine.h"

namespace engine::archs {

// embedding_length, block_count, head counts, key_length, rope.dimension_count, expert counts,
// context_length, the RMSNorm epsilon, rope.freq_base, and the expert width (the expert
// tensors' own, or expert_feed_forward_length / feed_forward_length for a core GGUF).
void read_base(Meta& m, Hparams& hp, int first_moe_layer = 0);

// expert_weights_norm, expert_gating_func (1 softmax, 2 sigmoid), expert groups, routed scale.
RouteOpts read_routing(Meta& m, const Hparams& hp, bool norm_default, bool sigmoid_default);

// A tensor width the metadata does not always carry: the tensor's own dimension d, else the
// key's value (a missing key is an error).
int64_t width(Meta& m, const std::string& tensor, int d, const std::string& key);

// rope.scaling.*: YaRN parameters when the file asks for YaRN and `yarn_ok`; any other scaling
// (or YaRN where not supported) is an error rather than a different computation.
std::optional<kernels::Yarn> read_yarn(Meta& m, const Hparams& hp, bool yarn_ok);

// Which of the first n_layer blocks are MoE where a family decides by the router's presence
// (Hy3, MiMo-V2: llama.cpp's rule): the file's blk.N.ffn_gate_inp.weight; for the metadata alone
// (expert-pack synth plans before there are tensors), the blocks from leading_dense_block_count
// on, a key such files carry for our planner only. At least one must be (else an error).
std::vector<char> moe_by_router(Meta& m, int n_layer);

// The trunk of such a family: block_count less nextn_predict_layers (hp.n_layer), which of its
// layers are MoE (moe_by_router), and read_base with the first MoE layer's expert width. Returns
// the file's block count (NextN blocks included; per-layer arrays have that many values) or 0
// with the error in m; *first_moe: the first MoE layer.
int read_trunk_by_router(Meta& m, Hparams& hp, std::vector<char>& moe, int* first_moe);

// rope_freqs.weight: llama3-style rope frequency factors (F32, n_rot / 2), optional, read
// where the file has them (RopeOpts::freq_factors). expert-pack synth writes them where the
// metadata asks (<arch>.synth_rope_freqs, a key for our planner only: the --dims test sizes).
struct RopeFreqs {
  Tensor t;
  bool synth = false;
  void read(Meta& m) { m.b("synth_rope_freqs", synth, false); }
  void plan(Plan& p, int64_t n_rot) {
    p.optional(t, "rope_freqs.weight", {n_rot / 2}, Role::RopeFactors, synth);
  }
};

// Which of n_layer layers have a sliding window (or Llama 4's chunks):
// attention.sliding_window_pattern as an array (non-zero: sliding; at least n_layer values), or
// as llama.cpp's period n (layer il slides unless il % n == n - 1, or with `global_first` unless
// il % n == 0; 0: every layer), default_period where the key is absent; default_period < 0: the
// array is required.
std::vector<char> read_swa_pattern(Meta& m, int n_layer, int default_period,
                                   bool global_first = false);

// The NextN blocks trailing a trunk of n_layer blocks (n_all in all), counted where the file has
// the first one's nextn.eh_proj (llama.cpp's trunk-only GGUFs declare them and leave them out):
// n_all - n_layer, else 0; 0 too where the per-block array `per_block` (a key without the
// architecture's prefix) stops at the trunk: without their values the blocks cannot run, and
// the trunk runs as before (--speculative mtp then says there is no block it runs).
int nextn_blocks(Meta& m, int n_layer, int n_all, const std::string& per_block = "");
// The head of llama.cpp's MiMo-V2 and Step-3.5 graph_mtp: the head reads the block's output after
// its norm (head_norm), the next step the output itself (their trunk's hidden row is its final
// residual row before output_norm too: Arch::nextn_hidden returns it).
Act nextn_prenorm_head(Engine& e, const Model& m, const NextnWeights& w, Act x, Act* next_hidden);

// A float per layer where the file has the array (missing values and a missing key: 0), the
// first n of them: the SwiGLU clamps (swiglu_clamp_exp, swiglu_clamp_shexp).
std::vector<float> per_layer_floats(Meta& m, const std::string& key, int n);

// Standard shapes.
inline int64_t q_width(const Hparams& hp) {
  return int64_t{hp.n_head} * hp.head_dim;
}
inline int64_t kv_width(const Hparams& hp) {
  return int64_t{hp.n_head_kv} * hp.head_dim;
}
inline KvRows gqa_rows(const Hparams& hp) {
  return {kv_width(hp), kv_width(hp)};
}

// Multi-head latent attention's projections (DeepSeek-V2/V3, Kimi-K3): the query through the
// q LoRA (attn_q_a, its norm, attn_q_b) or attn_q when there is none, and the latent rows
// (attn_kv_a_mqa, its first kv_lora floats normalised).
struct MlaProjections {
  Tensor wq, wq_a, q_a_norm, wq_b, wkv_a, kv_a_norm;
};
struct MlaQkv {
  Act q, kv;
  Act qa;  // the normalised q LoRA rows, where there is one (the lightning indexer reads them)
};
MlaQkv mla_project(Ops& ops, const MlaProjections& w, Act h, int64_t kv_lora, float eps);
// Their plan: the q LoRA (n_embd -> q_lora -> n_q) where q_lora > 0, else attn_q (n_embd -> n_q);
// attn_kv_a_mqa (n_embd -> kv_lora + n_rot) and the latent part's norm.
void plan_mla(Plan& p, MlaProjections& w, int64_t n_embd, int64_t q_lora, int64_t n_q,
              int64_t kv_lora, int64_t n_rot);

// The shared expert of an MoE layer (ffn_*_shexp), and its sigmoid gate when `gated`.
void plan_shared_expert(Plan& p, MoeWeights& w, const Hparams& hp, int64_t n_ff_shexp, bool gated);
void plan_ffn(Plan& p, FfnWeights& w, const Hparams& hp, int64_t n_ff);

// Grouped-query attention's weights as most families name them: attn_norm, attn_q/k/v (no
// biases), attn_output.
struct GqaWeights {
  Tensor attn_norm, wq, wk, wv, wo;
};
void plan_gqa(Plan& p, GqaWeights& w, const Hparams& hp);

// The FFN half of a block most families share: x += the dense FFN of rmsnorm(x, ffn_norm) where
// `moe` is null, else the MoE block (routed experts and any shared one) of rmsnorm(x, moe->norm).
// h: scratch of x's shape.
void ffn_half(Engine& e, int il, Act x, Act h, const MoeWeights* moe, const Tensor& ffn_norm,
              const FfnWeights& ffn, float eps);
// The same FFN's output, not added (for a norm after it: Trinity's sandwich norms).
Act ffn_out(Engine& e, int il, Act x, Act h, const MoeWeights* moe, const Tensor& ffn_norm,
            const FfnWeights& ffn, float eps);

// expert-pack synth: the sizes every preset sets (--dims changes the first eight; head_dim then
// becomes n_embd / n_head), and the metadata read_base reads back.
struct SynthSizes {
  int n_embd, n_layer, n_expert, n_expert_used, n_ff_exp, n_head, n_head_kv, head_dim, n_vocab;
  float rope_base = 10000.0f, eps = 1e-6f;
  int n_rot = 0;  // 0: the whole head
};
expertd::Status apply_dims(SynthSizes& s, const SynthDims& d);
expertd::Result<SynthModel> synth_base(const SynthSizes& s, const std::string& pre);
// The absorbed-MLA keys of current llama.cpp: the LoRA ranks, key/value_length the latent cache
// row, key/value_length_mla a head's query-key and value sizes, the rotated dims.
struct SynthMla {
  int q_lora, kv_lora, qk_nope, rope, v_head;
};
void synth_mla(SynthModel& m, const SynthMla& a);

}  // namespace engine::archs
