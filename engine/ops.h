// The ops an architecture's forward pass is written against, and that a backend (CPU:
// engine/cpu_ops.cpp, CUDA: engine/cuda_ops.cpp) implements. A backend knows no architecture:
// it knows where tensors live and how to compute each op there.
//
// Activations are float32 matrices of n_tokens rows in the backend's memory, handed out by the
// backend's scratch arena (valid until the arena is released past them). Ops are asynchronous
// where the backend is (CUDA); results reach the host only through to_host. An op that fails
// records the first error (status()) and later ops do nothing: architectures are written
// without error plumbing and the engine checks status() after each block.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/result.h"
#include "engine/model.h"
#include "kernels/kernels.h"

namespace engine {

struct Act {
  float* data = nullptr;
  int64_t rows = 0, cols = 0;  // tokens x values, row-major
  float* row(int64_t t) const { return data + t * cols; }
  int32_t* i32() const { return reinterpret_cast<int32_t*>(data); }  // an activation of ids
  Act rows_from(int64_t first) const { return {data + first * cols, rows - first, cols}; }
};

// Columns [first, first + n) of every row of an activation: a view that the ops taking one
// (copy, rms_norm, matmul) read or write in place of a whole activation; an Act is all its
// columns. Other ops take whole activations only (the type says which).
struct Cols {
  Act a;
  int64_t first = 0, n = 0;
  Cols(Act x) : a(x), n(x.cols) {}  // implicit: an Act is all its columns
  Cols(Act x, int64_t first_, int64_t n_) : a(x), first(first_), n(n_) {}
  Cols(float* data, int64_t rows, int64_t cols) : Cols(Act{data, rows, cols}) {}  // a whole one
  bool whole() const { return first == 0 && n == a.cols; }
  int64_t rows() const { return a.rows; }
  int64_t stride() const { return a.cols; }  // floats from a row to the next
  float* data() const { return a.data + first; }
  float* row(int64_t t) const { return a.row(t) + first; }
};
inline Cols columns(Act x, int64_t first, int64_t n) {
  return {x, first, n};
}

struct RopeOpts {
  float base = 10000.0f;
  bool neox = true;                     // NeoX pairs (i, i + n_rot/2), else adjacent (2i, 2i+1)
  const kernels::Yarn* yarn = nullptr;  // YaRN context extension, or none
  bool inverse = false;                 // rotate back (ggml's rope_back)
  // rope_freqs (F32, n_rot / 2): each pair's angle divided by its factor (llama3-style scaling,
  // as ggml's rope factors); absent: none.
  Tensor freq_factors;
};

// Causal attention over the layer's KV cache (grouped-query: head h reads KV head h / (n_head /
// n_head_kv)). The layer's key rows may be wider than n_head_kv head_dim: the rest of each row is
// an indexer's key (MiniMax-M3's sparse attention, Ops::block_scores), which attention neither
// stores nor reads.
struct AttnOpts {
  int n_head = 0, n_head_kv = 0;
  int64_t head_dim = 0;  // keys (and values, unless head_dim_v)
  float scale = 1.0f;
  int window = 0;  // > 0: a token sees the last `window` positions only
  int chunk = 0;   // > 0: a token sees the positions of its own chunk of `chunk` only (Llama 4)
  Tensor sinks;    // optional: one extra softmax logit per head (F32, n_head)
  // Optional, block-sparse attention (MiniMax-M3): per token and KV head the ids of the blocks of
  // `block` positions its query heads attend to (T x n_head_kv k: each KV head's k ids, -1 for
  // none, in any order), within what the token sees; ascending positions.
  Act blocks;
  int block = 0;
  int64_t head_dim_v = 0;  // > 0: the values' head size where it is not the keys' (MiMo-V2)
  int64_t dv() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
};

// Llama 4's attention temperature, as Mistral Large 3 (deepseek2) carries it: each query row
// times log(floor((pos + offset) / length) + 1) scale + 1 at its position (llama.cpp's
// attn_temperature_scale / attn_temperature_length), in double as llama.cpp computes it.
struct AttnTemp {
  float scale = 0.0f, offset = 0.0f;
  int length = 0;
  explicit operator bool() const { return scale != 0.0f; }
};
inline float attn_temperature_factor(const AttnTemp& t, int64_t pos) {
  return float(std::log(std::floor((float(pos) + t.offset) / float(t.length)) + 1.0) * t.scale +
               1.0);
}

// Multi-head latent attention, computed the absorbed way (DeepSeek-V2/V3).
struct MlaOpts {
  int n_head = 0;
  int64_t kv_lora = 0, n_rot = 0, qk_nope = 0, v_mla = 0;  // a latent row: kv_lora + n_rot floats
  float scale = 1.0f;
  AttnTemp temp;  // optional: the absorbed queries times the temperature (llama.cpp's order)
};

// The lightning indexer of DeepSeek-V3.2 and GLM-5 (DSA): one key row of `dim` values per
// position, kept as the layer's value rows (the latent rows of MLA are its keys); each token
// scores every position it sees and attends to the top-k of them.
struct IndexOpts {
  int heads = 0;
  int64_t dim = 0;
  float scale = 1.0f;  // of the head weights
};

// MiniMax-M3's sparse attention (MSA): per position an indexer key of `dim` values, kept after
// the attention's keys in the layer's key rows (KvRows::k = n_head_kv head_dim + dim); per token
// and indexer head (one per KV head), the unscaled score q_h . k_p of every position it sees, the
// largest in each block of `block` positions, plus 1e30 on the `local` blocks ending at the
// token's own (llama.cpp's forcing bias: they always rank first). A row's top-k then names the
// blocks that KV head's query heads attend to (AttnOpts::blocks).
struct BlockIndexOpts {
  int heads = 0, block = 0, local = 0;
  int64_t dim = 0;
};

// The cache a layer keeps: values of keys and of values per position (0: none), a part of fixed
// size kept like them (DeepSeek-V4's window ring and compressed entries), and a recurrent state of
// fixed size in F32 (Kimi-K3's delta-rule layers, DeepSeek-V4's compressors' pending rows), zeroed
// where the layer needs it when an eval starts at position 0. The counts are of values, not bytes.
struct KvRows {
  int64_t k = 0, v = 0;
  int64_t state = 0;
  int64_t kv_state = 0;
};

// The element type of the keys, values and kv_state: F32, or F16 (llama.cpp's default cache type;
// half the bytes per position, every value rounded to nearest even as it is stored).
enum class KvType { F32, F16 };
inline size_t kv_type_size(KvType t) {
  return t == KvType::F16 ? 2 : 4;
}
inline const char* kv_type_name(KvType t) {
  return t == KvType::F16 ? "f16" : "f32";
}

// One sequence's part of an eval: rows [first, first + n) of every activation are its tokens at
// positions pos0.. of cache slot `slot` (each slot is a sequence's own KV cache and state).
// Row-wise ops (matmuls, norms, the experts) never look at this; the ops that read positions or
// caches (rope and the attentions) run once per sequence.
struct SeqRows {
  int slot = 0;
  int64_t first = 0, n = 0, pos0 = 0;
};

// The delta rule, as Kimi Delta Attention (Kimi-Linear, Kimi-K3) and the gated delta-net
// (Qwen3-Next, Qwen3.5-MoE) run it: per value head a dk x dv state, decayed per key dimension
// (KDA) or by one factor per head (per_head_decay: the gated delta-net), updated by the delta
// rule, read by the query. q and k have n_k_head heads of dk values, v n_v_head heads of dv, a
// multiple of n_k_head: value head h reads key head h / (n_v_head / n_k_head), as transformers'
// repeat_interleave (Qwen3-Next), or with tiled_heads key head h % n_k_head, as ggml_repeat
// (Qwen3.5's converter orders the value heads so). Before the scan, in the op: causal depthwise
// convolutions of d_conv taps with silu over q, k and v (one convolution over [q k v] is the same:
// its filter's rows split three ways), L2 norms of q and k per head, the decay gate and beta's
// sigmoid. The layer's state holds the convolutions' last d_conv - 1 inputs (q, k, v), then the
// heads' states.
struct DeltaOpts {
  int n_k_head = 0, n_v_head = 0;
  int64_t dk = 0, dv = 0;
  bool per_head_decay = false;  // g holds 1 value per value head, else dk
  bool tiled_heads = false;     // value head h reads key head h % n_k_head, else h / group
  int d_conv = 0;
  Tensor conv_q, conv_k, conv_v;  // F32 {d_conv, channels}: causal depthwise filters
  Tensor a;                       // F32 {n_v_head}: -exp(A_log), or exp(A_log) if a_positive
  float lower_bound =
      -INFINITY;            // finite: gate = lower_bound * sigmoid(-a * g), else softplus(g) a
  bool a_positive = false;  // a holds exp(A_log) (Ling 3.0's files): lower_bound * sigmoid(a g)
  float eps = 1e-6f;        // of the q and k L2 norms
  // Kimi Delta Attention: as many key as value heads, of one size, decayed per key dimension.
  static DeltaOpts kda(int n_head, int64_t head_dim, int d_conv) {
    DeltaOpts o;
    o.n_k_head = o.n_v_head = n_head, o.dk = o.dv = head_dim, o.d_conv = d_conv;
    return o;
  }
  int64_t gate_width() const { return per_head_decay ? 1 : dk; }  // of g, per value head
  int64_t key_head(int64_t h) const {                             // the key head value head h reads
    return tiled_heads ? h % n_k_head : h / (n_v_head / n_k_head);
  }
  int64_t state_floats() const {
    return (d_conv - 1) * (2 * n_k_head * dk + n_v_head * dv) + n_v_head * dk * dv;
  }
};

// DeepSeek-V4's hyper-connections: the residual is hc streams side by side (rows of hc * n_embd
// floats); each sub-layer reads a weighted sum of them and writes back a Sinkhorn-normalised
// mix of them plus its output.
struct HcOpts {
  int hc = 4, sinkhorn_iters = 1;
  float eps = 1e-6f;
  Tensor scale, base;  // F32: {3}, {(2 + hc) hc}; the output head's: {1}, {hc}
};

// DeepSeek-V4's attention of one layer (ratio 0: a sliding window; 4: plus compressed entries
// of 4 positions picked by the lightning indexer; 128: plus every compressed entry of 128
// positions). One shared key/value row per position (MQA, values are the keys), attention
// sinks. The compressors pool their positions' rows per channel by a softmax of their scores
// (ratio 4: overlapping, the previous block's first half with this block's second), normalise
// and rotate the result; their pending rows and the entries live in the layer's state.
struct Dsv4AttnOpts {
  int n_head = 0, window = 0, ratio = 0;
  int64_t head_dim = 0, n_rot = 0;
  float scale = 1.0f, eps = 1e-6f;
  Tensor sinks;      // F32 {n_head}
  Tensor ape, norm;  // the compressor's position biases {coff D, ratio} and norm {D}
  RopeOpts rope;     // the compressed entries' rotation (the compressed layers' base, YaRN)
  int idx_heads = 0, top_k = 0;
  int64_t idx_dim = 0;
  float idx_scale = 1.0f;    // of the indexer's head weights
  Tensor idx_ape, idx_norm;  // the indexer's compressor
  int64_t coff() const { return ratio == 4 ? 2 : 1; }
  int pending() const { return ratio == 4 ? 2 * ratio : ratio; }  // rows kept per compressor
  int64_t entries(int n_ctx) const { return ratio > 0 ? (n_ctx + ratio - 1) / ratio : 0; }
  // Where the parts of the layer's cache start, in values: in the state the compressors' pending
  // rows (each kv then scores, width floats per row), in the kv_state the window ring (at 0) then
  // each compressor's entries.
  struct Layout {
    int64_t comp_state = 0, idx_state = 0, comp_entries = 0, idx_entries = 0;
  };
  Layout layout(int n_ctx) const {
    Layout l;
    l.comp_entries = int64_t{window} * head_dim;
    l.idx_state = 2 * pending() * coff() * head_dim;
    l.idx_entries = l.comp_entries + entries(n_ctx) * head_dim;
    return l;
  }
  // The layer's cache: the pending rows (F32 state: per compressor kv then scores) and the
  // window ring then the entries (kv_state, in the cache's type).
  KvRows cache_rows(int n_ctx) const {
    KvRows r;
    r.kv_state = int64_t{window} * head_dim;
    if (ratio > 0)
      r.state += 2 * pending() * coff() * head_dim, r.kv_state += entries(n_ctx) * head_dim;
    if (ratio == 4) r.state += 2 * pending() * 2 * idx_dim, r.kv_state += entries(n_ctx) * idx_dim;
    return r;
  }
};
// What DeepSeek-V4's compressors take in per token: the attention compressor's rows and scores
// (T x coff head_dim, ratio > 0; scores before the position bias), the indexer's (T x 2 idx_dim,
// ratio 4).
struct Dsv4CompressIn {
  Act comp_kv, comp_score;
  Act idx_kv, idx_score;
};

// One MoE layer's routing as the expert computation needs it.
struct Route {
  std::vector<uint32_t> experts;  // selected, in descending score order
  std::vector<float> weights;     // final mixing weights, same order
};
struct MoeRoutes {
  int n_tokens = 0, k = 0;
  std::vector<uint32_t> experts;             // the layer's unique experts, ascending
  std::vector<std::vector<int32_t>> tokens;  // per unique expert: the tokens routed to it
  std::vector<std::vector<int32_t>> outs;    // per unique expert: their output rows, token * k + j
  std::vector<float> weights;                // n_tokens x k mixing weights, in router order
};

// A layer's routes grouped by expert (its MoeRoutes): each unique expert, ascending, with its
// tokens and their output rows. Keeps r's buffers.
void group_routes(std::span<const Route> routes, int n_expert, int k, MoeRoutes& r);

// silu(x) = x sigmoid(x), as ggml computes it; softplus(x) = log(1 + e^x), x above 20 (ggml's).
enum class Unary { Sigmoid, Silu, Softplus };

struct ExpertWeights {
  Tensor gate, up, down;        // one expert: {in, out}
  Tensor gate_b, up_b, down_b;  // its biases (F32), when the model has them (gpt-oss)
};

class Ops {
 public:
  virtual ~Ops() = default;
  virtual std::string name() const = 0;  // "avx2", "cuda:0 NVIDIA H200", ...
  virtual expertd::Status status() const = 0;
  // Bytes of the backend's own rearranged copies of weights (the CPU's interleaved rows).
  virtual uint64_t weight_copy_bytes() const { return 0; }

  // Scratch: alloc hands out rows x cols floats (uninitialised); release_to(mark()) frees what
  // was allocated since. begin_eval lets the arena consolidate between evaluations and sets the
  // sequences of the eval (their rows in order, covering every row).
  virtual Act alloc(int64_t rows, int64_t cols) = 0;
  virtual size_t mark() const = 0;
  virtual void release_to(size_t mark) = 0;
  void begin_eval(std::span<const SeqRows> seqs) {
    seqs_.assign(seqs.begin(), seqs.end());
    consolidate();
  }
  // The eval's furthest position, plus one (its longest sequence's length after it).
  int64_t end_position() const {
    int64_t n = 0;
    for (const SeqRows& s : seqs_) n = std::max(n, s.pos0 + s.n);
    return n;
  }
  // n_slots caches (sequences) of n_ctx positions, each with per_layer rows, in `type`. A backend
  // that cannot keep that type says so in status().
  virtual void init_cache(const std::vector<KvRows>& per_layer, int n_ctx, int n_slots,
                          KvType type) = 0;
  // Cache slot `slot` after its first n positions, as bytes, layer by layer: the key rows and
  // value rows of positions [0, n) and the kv_state in the cache's type, then the recurrent state
  // (F32) — what resuming at n needs. Backends that cannot copy their caches out return false
  // (prefix reuse is then off).
  // From layer first_layer on only, where given (the NextN block's own cache).
  virtual bool save_slot(int /*slot*/, int64_t /*n*/, std::vector<uint8_t>& /*out*/,
                         int /*first_layer*/ = 0) {
    return false;
  }
  // The reverse, of a copy saved after n_saved positions, keeping its first n (n < n_saved only
  // where no layer has a recurrent state).
  virtual bool load_slot(int /*slot*/, int64_t /*n_saved*/, int64_t /*n*/,
                         std::span<const uint8_t> /*in*/, int /*first_layer*/ = 0) {
    return false;
  }

  virtual void embed(const Tensor& tok_embd, std::span<const int32_t> tokens, Act x) = 0;
  virtual void to_host(Act x, float* dst) = 0;          // waits for the backend
  virtual void from_host(const float* src, Act x) = 0;  // src may be reused when it returns

  // y = x W^T; w may be 2-D matrix i of a 3-D tensor, or rows of a matrix (Tensor::rows).
  virtual void matmul(const Tensor& w, Cols x, Cols y) = 0;
  virtual void add_bias(Act y, const Tensor& b) = 0;  // each row += b
  virtual void add(Act y, Act x) = 0;                 // y += x
  // y = x / rms(x) * w over each group of n columns (n = 0: all of x's columns); y may be x.
  virtual void rms_norm(Cols x, const Tensor& w, Cols y, float eps, int64_t n = 0) = 0;
  // y = (x - mean) / sqrt(variance + eps) * w + b over each row (ggml's norm; w and b F32 and
  // optional); y may be x.
  virtual void layer_norm(Act x, const Tensor& w, const Tensor& b, Act y, float eps) = 0;
  // The same two into newly allocated activations.
  Act matmul(const Tensor& w, Act x) {
    Act y = alloc(x.rows, w.ne[1]);
    matmul(w, x, y);
    return y;
  }
  Act rms_norm(Act x, const Tensor& w, float eps) {
    Act y = alloc(x.rows, x.cols);
    rms_norm(x, w, y, eps);
    return y;
  }
  // Rotates n_rot dims from `offset` of every head (heads head_stride floats apart) of each
  // row, at its sequence's position.
  void rope(Act x, int64_t head_stride, int64_t offset, int64_t n_rot, const RopeOpts& o) {
    for (const SeqRows& s : seqs_) rope_at(part(x, s), head_stride, offset, n_rot, s.pos0, o);
  }
  // Stores k and v at their positions of layer il's cache, then attends: out = n_head x head_dim
  // per row.
  void attention(int il, Act q, Act k, Act v, const AttnOpts& o, Act out) {
    AttnOpts os = o;
    for (const SeqRows& s : seqs_) {
      os.blocks = part(o.blocks, s);
      attention_at(s.slot, il, part(q, s), part(k, s), part(v, s), s.pos0, os, part(out, s));
    }
  }
  // Stores the latent rows kv (normalised, rotated) in layer il's cache; per head, the query
  // taken into the latent space with wk_b, attention over the latent rows, wv_b back out.
  // q: n_head x (qk_nope + n_rot) per row; out: n_head x v_mla per row.
  // With `sel` (T x k positions, -1 for none, in any order: the lightning indexer's top-k) a
  // token attends to its selected positions only, in ascending order.
  void attention_mla(int il, Act q, Act kv, const Tensor& wk_b, const Tensor& wv_b,
                     const MlaOpts& o, Act out, Act sel = {}) {
    for (const SeqRows& s : seqs_)
      attention_mla_at(s.slot, il, part(q, s), part(kv, s), wk_b, wv_b, s.pos0, o, part(out, s),
                       part(sel, s));
  }
  // Each row's blocks of n values times the orthonormal Walsh-Hadamard matrix of order n (a power
  // of two), as ggml's fwht computes it: scaled by 1 / sqrt(n), then butterflies of span 1, 2,
  // 4, ... (llama.cpp rotates the lightning indexer's queries and keys so before they are cached).
  virtual void hadamard(Act x, int64_t n) = 0;
  // The lightning indexer (IndexOpts): stores k (T x dim) as its positions' index keys in layer
  // il's value rows, then each token's score of every position it sees, sum over heads of
  // relu(q_h . k_p) w_h scale (ggml's fused order), -inf for the positions it does not see.
  // q: T x heads dim, w: T x heads. Columns: the eval's end_position().
  Act index_scores(int il, const IndexOpts& o, Act q, Act k, Act w) {
    Act scores = alloc(q.rows, end_position());
    for (const SeqRows& s : seqs_)
      index_scores_at(s.slot, il, o, part(q, s), part(k, s), part(w, s), s.pos0, part(scores, s));
    return scores;
  }
  // MSA's block scores (BlockIndexOpts): stores k (T x dim) as its positions' indexer keys, the
  // tail of layer il's key rows, then per token and head the score of each block of the eval's
  // end_position() (T x heads nblk, head-major; -inf for the blocks past the token's own).
  // q: T x heads dim.
  Act block_scores(int il, const BlockIndexOpts& o, Act q, Act k) {
    const int64_t nblk = (end_position() + o.block - 1) / o.block;
    Act scores = alloc(q.rows, o.heads * nblk);
    for (const SeqRows& s : seqs_)
      block_scores_at(s.slot, il, o, part(q, s), part(k, s), s.pos0, part(scores, s));
    return scores;
  }
  // Each row of x (at its sequence's positions) times its attention temperature (AttnTemp):
  // Llama 4's queries on its layers without RoPE.
  void attn_temperature(Act x, const AttnTemp& t) {
    for (const SeqRows& s : seqs_) attn_temperature_at(part(x, s), s.pos0, t);
  }
  // Row t of x times f[t] (host values): Llama 4's router weight on an expert's input.
  virtual void scale_rows(Act x, std::span<const float> f) = 0;
  virtual void ffn(const FfnWeights& w, Act h, Act out) = 0;  // down(act(gate h, up h))
  virtual void copy(Cols dst, Cols src) = 0;                  // same shape
  virtual void repeat(Act x, int n, Act out) = 0;             // each row of out: x's row n times
  // y *= f(g), elementwise: Kimi-K3's output gates (sigmoid), the gated delta-net's (silu); or,
  // where g is narrower (y.cols a multiple of g.cols), each g value over its own run of
  // y.cols / g.cols values of the row: Laguna's per-head softplus gates.
  virtual void mul_act(Act y, Act g, Unary f) = 0;
  // Kimi-K3's attention residuals: out = softmax over the n checkpoints (rows [j T, (j+1) T) of
  // `stack`, T = cur.rows) and cur of their scores rmsnorm(x) . w, applied to the raw rows.
  virtual void res_mix(Act stack, int n, Act cur, const Tensor& w, float eps, Act out) = 0;
  // The delta rule of layer il (DeltaOpts): q, k (T x n_k_head dk), v (T x n_v_head dv) before
  // their convolutions, g the decay gate before its activation (dt bias added; T x n_v_head
  // gate_width()), beta the update strength before its sigmoid (T x n_v_head); out: T x n_v_head
  // dv. Overwrites q, k, v, g, beta.
  void delta_rule(int il, const DeltaOpts& o, Act q, Act k, Act v, Act g, Act beta, Act out) {
    for (const SeqRows& s : seqs_)
      delta_rule_at(s.slot, il, o, part(q, s), part(k, s), part(v, s), part(g, s), part(beta, s),
                    s.pos0, part(out, s));
  }
  // y += sigmoid(gate . h) * x per row (gate absent: y += x).
  virtual void add_gated(Act y, Act x, const Tensor& gate, Act h) = 0;
  // Hyper-connections (HcOpts): from `mixes` (T x (2 + hc) hc: hc_fn times the normalised
  // streams; the head's: T x hc; none: the streams' mean) the pre weights sigmoid(m s0 + b) +
  // eps and, unless `head`, into
  // pc (T x hc + hc hc) the post weights 2 sigmoid(m s1 + b) and the Sinkhorn-normalised
  // combination (dst fastest); out = sum_h pre[h] x[h] (T x n_embd).
  virtual void hc_pre(Act x, Act mixes, const HcOpts& o, bool head, Act out, Act pc) = 0;
  // out[dst] = post[dst] f + sum_src comb[dst, src] x[src] (out is not x).
  virtual void hc_post(Act f, Act x, Act pc, int hc, Act out) = 0;
  // DeepSeek-V4's attention of layer il (Dsv4AttnOpts) is three ops and a top_k between them.
  // The compressors, tokens in order: each token's rows join the pending ring (its scores plus
  // the position bias); a block's last position makes its entry (per channel a softmax-weighted
  // sum over the block's positions, ratio 4 overlapping with the previous block), normalised and
  // rotated at the block's first position.
  void dsv4_compress(int il, const Dsv4AttnOpts& o, const Dsv4CompressIn& in) {
    for (const SeqRows& s : seqs_)
      dsv4_compress_at(
          s.slot, il, o,
          {part(in.comp_kv, s), part(in.comp_score, s), part(in.idx_kv, s), part(in.idx_score, s)},
          s.pos0);
  }
  // The lightning indexer (ratio 4): each token's score of every compressed entry it sees,
  // sum over heads of relu(q_h . k_j) w_h idx_scale (ggml's order), -inf for the entries it does
  // not see yet. q: T x idx_heads idx_dim (rotated), w: T x idx_heads. Columns: the entries the
  // eval's last position sees (at least one).
  Act dsv4_index(int il, const Dsv4AttnOpts& o, Act q, Act w) {
    Act scores = alloc(q.rows, std::max<int64_t>(1, end_position() / o.ratio));
    for (const SeqRows& s : seqs_)
      dsv4_index_at(s.slot, il, o, part(q, s), part(w, s), s.pos0, part(scores, s));
    return scores;
  }
  // Attention of each (token, head) over the token's window rows (this eval's from kv, older ones
  // from the window ring) and its compressed entries — those of its row of `sel` (T x k ids,
  // -1 for none, in any order; attended in ascending order), or with sel absent every entry it
  // sees — with a sink per head; then the window ring takes the eval's newest rows. q: T x n_head
  // head_dim and kv: T x head_dim, normalised and rotated; out: T x n_head head_dim.
  void attention_dsv4(int il, const Dsv4AttnOpts& o, Act q, Act kv, Act sel, Act out) {
    for (const SeqRows& s : seqs_)
      attention_dsv4_at(s.slot, il, o, part(q, s), part(kv, s), part(sel, s), s.pos0, part(out, s));
  }
  // Row-wise: the columns of each row's k largest values into ids (T x k), in descending order
  // of value, ties as ggml's CPU top_k breaks them (std::partial_sort's order); -inf is never
  // chosen: its place holds -1 (so k may exceed the columns that hold values).
  virtual void top_k(Act x, int k, Act ids) = 0;

  // Routing: every token's experts and weights from the router logits (which it may overwrite);
  // `forced` (n_tokens x k, or null): the experts, chosen by the token (hash routing).
  virtual void route(Act logits, const MoeWeights& w, int k, const int32_t* forced,
                     std::vector<Route>& out);
  // The expert computation of one MoE layer: begin with the layer's inputs and routes, run the
  // experts in batches as they become available (in any order), end with the weighted sum of
  // each token's experts in router order (so the order of arrival never changes the result).
  virtual void moe_begin(Act h, const MoeRoutes& r) = 0;
  virtual void moe_experts(const MoeWeights& w, std::span<const size_t> idx,
                           std::span<const ExpertWeights> ws) = 0;
  virtual void moe_end(Act out) = 0;
  // The whole expert computation of one MoE layer in the backend, routing included, where the
  // experts are the model's own and resident there (expert-run --local on the GPU) and the
  // backend can route this layer itself: out = the routed experts' weighted sum for h, with no
  // routes on the host (Engine::routes() keeps none for the layer). False where it cannot; the
  // engine then routes through route() and runs moe_begin/moe_experts/moe_end.
  virtual bool moe_resident(Act /*logits*/, const MoeWeights& /*w*/, int /*k*/, Act /*h*/,
                            Act /*out*/) {
    return false;
  }

 protected:
  // The sequence-wise ops on one sequence's rows at positions pos0.., in cache slot `slot`.
  virtual void consolidate() = 0;
  virtual void rope_at(Act x, int64_t head_stride, int64_t offset, int64_t n_rot, int64_t pos0,
                       const RopeOpts& o) = 0;
  virtual void attention_at(int slot, int il, Act q, Act k, Act v, int64_t pos0, const AttnOpts& o,
                            Act out) = 0;
  // Each row of x (positions pos0..) times its attention temperature (MlaOpts::temp).
  virtual void attn_temperature_at(Act x, int64_t pos0, const AttnTemp& t) = 0;
  virtual void attention_mla_at(int slot, int il, Act q, Act kv, const Tensor& wk_b,
                                const Tensor& wv_b, int64_t pos0, const MlaOpts& o, Act out,
                                Act sel) = 0;
  virtual void index_scores_at(int slot, int il, const IndexOpts& o, Act q, Act k, Act w,
                               int64_t pos0, Act scores) = 0;
  virtual void block_scores_at(int slot, int il, const BlockIndexOpts& o, Act q, Act k,
                               int64_t pos0, Act scores) = 0;
  virtual void delta_rule_at(int slot, int il, const DeltaOpts& o, Act q, Act k, Act v, Act g,
                             Act beta, int64_t pos0, Act out) = 0;
  virtual void dsv4_compress_at(int slot, int il, const Dsv4AttnOpts& o, const Dsv4CompressIn& in,
                                int64_t pos0) = 0;
  virtual void dsv4_index_at(int slot, int il, const Dsv4AttnOpts& o, Act q, Act w, int64_t pos0,
                             Act scores) = 0;
  virtual void attention_dsv4_at(int slot, int il, const Dsv4AttnOpts& o, Act q, Act kv, Act sel,
                                 int64_t pos0, Act out) = 0;
  // A sequence's rows of x (an absent activation stays absent).
  static Act part(Act x, const SeqRows& s) { return x.data ? Act{x.row(s.first), s.n, x.cols} : x; }

 private:
  std::vector<SeqRows> seqs_;
};

// top_k of one row of n values into ids (k of them): the CPU's definition, which the CUDA backend
// shares.
void top_k_row(const float* x, int64_t n, int k, int32_t* ids);
// One row of the Walsh-Hadamard rotation (Ops::hadamard), the CPU's definition.
void hadamard_row(float* x, int64_t n);
// The lightning indexer's score of one key k: sum over heads of relu(q_h . k) w_h scale, in
// ggml's order (DeepSeek-V4's and DeepSeek-V3.2's indexers, the CPU's definition).
float index_score(const float* q, const float* w, const float* k, int heads, int64_t dim,
                  float scale, kernels::Isa be);

// Softmax, sigmoid or sqrt-softplus gating, selection bias, groups, top-k then softmax, on one
// token's logits (overwritten with the gate scores). Ties go to the lower expert id (llama.cpp's
// stable order). `forced` (k ids, or null): the experts, weighted by their scores.
void select_experts(const RouteOpts& o, const Tensor& exp_probs_b, int n_expert, int k,
                    float* logits, Route& r, const int32_t* forced = nullptr);

}  // namespace engine
