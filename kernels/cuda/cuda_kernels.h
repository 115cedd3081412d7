// CUDA kernels for MoE inference: the device counterparts of kernels/kernels.h. Weights stay in
// their GGML type (F32, F16, BF16, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K, MXFP4: block layouts of
// kernels/quant_blocks.h)
// and are dequantized inside the matmul; activations are float32. All pointers are device
// pointers; every call is asynchronous on `stream` and returns the launch status.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/kernels.h"

namespace kernels::cuda {

bool weight_type_supported(uint32_t type);

// The matmul's dequantization of one row (n elements) compiled for the host: CPU tests check its
// bit layouts against kernels::dequantize_row without a GPU. Returns false for unsupported types.
bool dequantize_row_host(uint32_t type, const void* row, float* y, int64_t n);

// y[t * rows + r] = sum_c W[r, c] * x[t * cols + c] for t < n_tokens (decode: n_tokens = 1;
// prefill: the tokens grouped per expert). W is rows x cols, row-major, cols a multiple of the
// type's block.
cudaError_t matmul(uint32_t wtype, const void* w, int64_t rows, int64_t cols, const float* x,
                   int64_t n_tokens, float* y, cudaStream_t stream);
// The same for slots that each take their own matrix of a stack (the experts of a layer, held
// matrix_bytes apart): y row j (rows floats) = matrix ids[j] times x row j / x_div (the routed
// slots of a token, t k + j, read its row t with x_div = k). Each slot's sums are matmul's for
// that token, in the same order.
cudaError_t matmul_id(uint32_t wtype, const void* w, size_t matrix_bytes, int64_t rows,
                      int64_t cols, const int32_t* ids, int64_t n_slots, const float* x,
                      int64_t x_div, float* y, cudaStream_t stream);

// Each of n_rows rows of n: y = x / rms(x) * w (w may be null: no weight).
cudaError_t rms_norm(const float* x, const float* w, float* y, int64_t n, int64_t n_rows, float eps,
                     cudaStream_t stream);
// Each of n_rows rows of n: y = (x - mean) / sqrt(variance + eps) * w + b (w, b may be null).
cudaError_t layer_norm(const float* x, const float* w, const float* b, float* y, int64_t n,
                       int64_t n_rows, float eps, cudaStream_t stream);
// The same as rms_norm over rows that sit x_stride / y_stride floats apart (MLA's latent part of a
// cache row).
cudaError_t rms_norm_strided(const float* x, int64_t x_stride, const float* w, float* y,
                             int64_t y_stride, int64_t n, int64_t n_rows, float eps,
                             cudaStream_t stream);

// x holds n_tokens x n_heads heads, head_stride floats apart, whose first n_rot floats rotate
// (MLA passes a pointer to the rotated tail of each head); token t sits at position pos0 + t.
// NeoX pairs (i, i + n_rot/2) or adjacent pairs (2i, 2i+1); theta = pos * base^(-2i/n_rot),
// computed as kernels::rope does; yarn and freq_factors (device, n_rot / 2; may be null) as
// kernels::rope applies them.
cudaError_t rope(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_stride, int64_t n_rot,
                 int64_t pos0, float base, bool neox, const kernels::Yarn* yarn,
                 cudaStream_t stream, bool inverse = false, const float* freq_factors = nullptr);

// out[i] = silu(gate[i]) * up[i]
cudaError_t swiglu(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream);
// gpt-oss: x = min(gate, 7), out = x * sigmoid(1.702 x) * (clamp(up, -7, 7) + 1)
cudaError_t swiglu_oai(const float* gate, const float* up, float* out, int64_t n,
                       cudaStream_t stream);
// DeepSeek-V4: out = silu(min(gate, limit)) * clamp(up, -limit, limit); `after` (Step 3.5):
// min(silu(gate), limit) * clamp(up, -limit, limit)
cudaError_t swiglu_limit(const float* gate, const float* up, float* out, int64_t n, float limit,
                         bool after, cudaStream_t stream);

// Kimi-K3's situ: beta tanh(g / beta) sigmoid(g) * linear_beta tanh(u / linear_beta) (the up
// side plain when linear_beta <= 0).
cudaError_t situ(const float* gate, const float* up, float* out, int64_t n, float beta,
                 float linear_beta, cudaStream_t stream);
// y[i] *= f(g[i / span]): op 0 sigmoid, 1 silu (g / (1 + exp(-g)), ggml's), 2 softplus (ggml's:
// log(1 + exp(g)), g above 20).
cudaError_t mul_act(float* y, const float* g, int64_t n, int op, int64_t span, cudaStream_t stream);
// Row r (position pos0 + r) of x (rows x cols) times log(floor((pos + offset) / length) + 1)
// scale + 1, in double (engine::attn_temperature_factor).
cudaError_t attn_temperature(float* x, int64_t rows, int64_t cols, int64_t pos0, float scale,
                             float offset, int length, cudaStream_t stream);
// Kimi-K3's attention residuals (engine::Ops::res_mix): per token, the softmax over the n
// checkpoint rows (stack row j * n_tokens + t) and cur's row of their scores, rmsnorm(x) . w,
// applied to the raw rows. n <= 64.
cudaError_t res_mix(const float* stack, int n, const float* cur, const float* w, float* out,
                    int64_t n_tokens, int64_t n_embd, float eps, cudaStream_t stream);
// The delta rule (engine::Ops::delta_rule, engine::DeltaOpts): q, k, v convolved in place with
// the state's windows, then the recurrence over n_tokens; state = (d_conv - 1) (2 n_k_head dk +
// n_v_head dv) conv floats, then the value heads' dk x dv states. dk <= 256.
struct Delta {
  float *q = nullptr, *k = nullptr, *v = nullptr, *g = nullptr, *beta = nullptr;
  float *state = nullptr, *out = nullptr;
  const float *conv_q = nullptr, *conv_k = nullptr, *conv_v = nullptr, *a = nullptr;
  int64_t n_tokens = 0, n_k_head = 0, n_v_head = 0, dk = 0, dv = 0;
  bool per_head_decay = false;
  bool tiled_heads = false;  // value head h reads key head h % n_k_head, else h / group
  int d_conv = 0;
  float lower_bound = 0, eps = 0;
  bool a_positive = false;  // the bounded gate is lower_bound * sigmoid(a g), else sigmoid(-a g)
};
cudaError_t delta_rule(const Delta& a, cudaStream_t stream);
// Per token: softmax over n_expert router logits, the k largest (ties: lower id first), their
// probabilities, renormalised to sum 1 when norm_topk. ids and weights are n_tokens x k.
cudaError_t softmax_topk(const float* logits, int64_t n_tokens, int64_t n_expert, int k,
                         bool norm_topk, int32_t* ids, float* weights, cudaStream_t stream);
// The other routings, as engine::select_experts computes them step for step (k <= 32, groups
// <= 64): the router logits p (overwritten with the gate scores: softmax, sigmoid or
// sqrt-softplus), the selection bias, the groups kept by their two best, the top k (ties: lower
// id first), their scores renormalised and scaled; or gpt-oss's top k of the logits, then their
// softmax. ids and weights are n_tokens x k.
struct RouteSelect {
  float* p = nullptr;
  const float* bias = nullptr;
  int32_t* ids = nullptr;
  float* weights = nullptr;
  int64_t n_tokens = 0, n_expert = 0;
  int k = 0, n_group = 1, n_group_used = 1;
  bool sigmoid = false, sqrt_softplus = false, topk_then_softmax = false, norm_topk = false;
  float w_scale = 1.0f;
};
cudaError_t route_select(const RouteSelect& r, cudaStream_t stream);
// y row j += b's row ids[j] (rows of n floats): each routed slot's expert bias.
cudaError_t add_rows_id(float* y, const float* b, const int32_t* ids, int64_t n, int64_t n_rows,
                        cudaStream_t stream);

// Causal attention with a KV cache, as kernels::attend: q holds positions n_past ..
// n_past + n_tokens - 1, the caches n_past + n_tokens positions. Keys of dk and values of dv
// floats (MLA: keys are whole latent rows, values their first kv_lora floats, k == v), cache rows
// k_row / v_row floats apart, head kvh's key at k + j * k_row + kvh * dk. q is
// n_tokens x n_head x dk, out n_tokens x n_head x dv.
// window > 0: token at position p sees keys p - window + 1 .. p. sinks (may be null): one logit per
// head that joins the softmax's denominator (gpt-oss).
struct Attention {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  float* out = nullptr;
  int64_t n_tokens = 0, n_past = 0, n_head = 0, n_head_kv = 1, dk = 0, dv = 0, k_row = 0, v_row = 0;
  float scale = 1.0f;
  int64_t window = 0;
  int64_t chunk = 0;  // > 0: only the keys of the token's own chunk of `chunk` positions
  const float* sinks = nullptr;
  // Optional: token t attends to the sel_n[t] positions sel[t * sel_stride ..] (ascending) only,
  // not to its causal window (dsv4_select makes such lists); with sel_per_kv a list per token and
  // KV head, list t n_head_kv + kvh (msa_block_positions makes such lists).
  const int32_t *sel = nullptr, *sel_n = nullptr;
  int64_t sel_stride = 0;
  bool sel_per_kv = false;
};
cudaError_t attention(const Attention& a, cudaStream_t stream);
// Each row's blocks of n floats (a power of two) times the orthonormal Walsh-Hadamard matrix, in
// place: engine::hadamard_row's steps (n_blocks blocks in all).
cudaError_t hadamard(float* x, int64_t n_blocks, int64_t n, cudaStream_t stream);
// The widest value (dv) attention takes; keys are not limited in number.
inline constexpr int64_t kMaxAttentionDv = 1024;

// out[t] = sum_k weights[t * k_used + k] * expert_out[(t * k_used + k) * n], summed in k order.
cudaError_t weighted_sum(const float* expert_out, const float* weights, float* out,
                         int64_t n_tokens, int64_t k_used, int64_t n, cudaStream_t stream);

// Small data movement and elementwise helpers of the forward pass.
cudaError_t add(float* y, const float* x, int64_t n, cudaStream_t stream);  // y += x
// Row r of y (n floats each) times f[r].
cudaError_t scale_rows(float* y, const float* f, int64_t n, int64_t n_rows, cudaStream_t stream);
cudaError_t add_rows(float* y, const float* b, int64_t n, int64_t n_rows,
                     cudaStream_t stream);  // each row += b
// dst row i = src row idx[i] (gather) / dst row idx[i] = src row i (scatter); rows of n floats.
cudaError_t gather_rows(const float* src, const int32_t* idx, float* dst, int64_t n_rows, int64_t n,
                        cudaStream_t stream);
cudaError_t scatter_rows(const float* src, const int32_t* idx, float* dst, int64_t n_rows,
                         int64_t n, cudaStream_t stream);
// y row r += sigmoid(gate[r]) * x row r (gate null: plain add).
cudaError_t add_gated(float* y, const float* x, const float* gate, int64_t n, int64_t n_rows,
                      cudaStream_t stream);

// DeepSeek-V4 (engine::Ops::hc_pre / hc_post / attention_dsv4, engine/ops.h).
// Hyper-connections, one block per token: from mixes (T x (2 + hc) hc, or T x hc for the head,
// or null: the streams' mean) the pre weights, and unless `head` the post weights and the
// Sinkhorn-normalised combination into pc (T x hc + hc hc); out = sum_h pre[h] x[h].
cudaError_t hc_pre(const float* x, const float* mixes, const float* scale, const float* base,
                   int hc, int sinkhorn_iters, float eps, bool head, float* out, float* pc,
                   int64_t n_tokens, int64_t n, cudaStream_t stream);
// out[dst] = post[dst] f + sum_src comb[dst, src] x[src], rows of hc x n floats.
cudaError_t hc_post(const float* f, const float* x, const float* pc, int hc, float* out,
                    int64_t n_tokens, int64_t n, cudaStream_t stream);
// Each row of out: x's row (cols floats) n times.
cudaError_t repeat_rows(const float* x, int n, float* out, int64_t rows, int64_t cols,
                        cudaStream_t stream);
// One compressor, tokens in order: each row joins the pending ring (its score plus the position
// bias); a block's last position makes its entry (per channel a softmax-weighted sum over the
// block's positions, or for overlap the previous block's first halves and this block's second),
// normalised and rotated at the block's first position.
struct Dsv4Compress {
  const float *kv = nullptr, *score = nullptr, *ape = nullptr, *norm = nullptr;
  float *pend_kv = nullptr, *pend_score = nullptr, *entries = nullptr;
  int64_t n_tokens = 0, pos0 = 0, ratio = 0, slots = 0, width = 0, dim = 0, n_rot = 0;
  float eps = 1e-6f, rope_base = 10000.0f;
  bool use_yarn = false;
  kernels::Yarn yarn;
};
cudaError_t dsv4_compress(const Dsv4Compress& c, cudaStream_t stream);
// The lightning indexer's scores (n_tokens x n_max): entry j < (pos0 + t + 1) / ratio of token t
// scores sum_h relu(q_h . k_j) w_h scale; the others -inf.
cudaError_t dsv4_index_scores(const float* q, const float* w, const float* entries, float* scores,
                              int64_t n_tokens, int64_t pos0, int64_t ratio, int64_t heads,
                              int64_t dim, int64_t n_max, float scale, cudaStream_t stream);
// Attention of each (token, head) over the token's window rows (this eval's from kv, older ones
// from the window ring) then its sel_n[t] entries sel[t * sel_stride ..] (values are the keys),
// with a sink per head.
struct Dsv4Attention {
  const float *q = nullptr, *kv = nullptr, *ring = nullptr, *entries = nullptr, *sinks = nullptr;
  const int32_t *sel = nullptr, *sel_n = nullptr;
  float* out = nullptr;
  int64_t n_tokens = 0, pos0 = 0, n_head = 0, dim = 0, window = 0, sel_stride = 0;
  float scale = 1.0f;
};
cudaError_t dsv4_attention(const Dsv4Attention& a, cudaStream_t stream);
// Each token's entry list for dsv4_attention, ascending: its row of ids (n_tokens x stride, -1
// for none, any order), or with ids null every entry it sees ((pos0 + t + 1) / ratio of them,
// at most stride). sel is n_tokens x stride, sel_n n_tokens counts.
cudaError_t dsv4_select(const int32_t* ids, int64_t n_tokens, int64_t pos0, int64_t ratio,
                        int32_t* sel, int32_t* sel_n, int64_t stride, cudaStream_t stream);
// The window ring (window rows of dim floats, position p at p % window) takes the newest rows.
cudaError_t dsv4_ring_store(const float* kv, float* ring, int64_t n_tokens, int64_t pos0,
                            int64_t window, int64_t dim, cudaStream_t stream);

// MiniMax-M3's sparse attention (engine::BlockIndexOpts): per (token, head) the largest score
// q_h . k_p over each block's positions p <= pos0 + t (keys: key_row floats apart), -inf for the
// blocks past the token's own, + 1e30 on the `local` blocks ending at its own. scores: n_tokens x
// heads x n_blocks.
struct BlockScores {
  const float* q = nullptr;     // n_tokens x heads x dim
  const float* keys = nullptr;  // position p's key at keys + p key_row
  float* scores = nullptr;
  int64_t n_tokens = 0, pos0 = 0, heads = 0, dim = 0, key_row = 0, block = 0, local = 0,
          n_blocks = 0;
};
cudaError_t msa_block_scores(const BlockScores& a, cudaStream_t stream);
// Per (token, KV head) of `blocks` (n_tokens x n_head_kv x per_kv block ids, -1 for none, any
// order) the positions of its blocks that the token sees (causal, within `window` where > 0),
// ascending, as attention's sel_per_kv lists: sel (n_tokens n_head_kv x stride, stride >= per_kv
// block) and sel_n.
cudaError_t msa_block_positions(const int32_t* blocks, int64_t n_tokens, int64_t n_head_kv,
                                int64_t per_kv, int64_t block, int64_t pos0, int64_t window,
                                int32_t* sel, int32_t* sel_n, int64_t stride, cudaStream_t stream);

}  // namespace kernels::cuda
