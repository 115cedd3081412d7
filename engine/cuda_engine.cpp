#include "engine/cuda_engine.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "client/cuda_slots.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/kernels.h"

namespace engine {

using expertd::make_error;
using expertd::Status;

namespace {

#define CU(expr)                                                                                      \
  do {                                                                                                \
    cudaError_t _e = (expr);                                                                          \
    if (_e != cudaSuccess)                                                                            \
      return make_error(std::string(#expr) + ": " + cudaGetErrorName(_e) + " (" + cudaGetErrorString(_e) + ")"); \
  } while (0)

// A weight in VRAM (or a view of one: an expert inside a slot or an uploaded expert tensor).
struct DevTensor {
  uint32_t type = 0;
  int64_t ne0 = 0, ne1 = 0;
  const uint8_t* data = nullptr;
  explicit operator bool() const { return data != nullptr; }
  const float* f32() const { return reinterpret_cast<const float*>(data); }
};

struct DevExpert {
  DevTensor gate, up, down;
  DevTensor gate_b, up_b, down_b;  // F32 biases (gpt-oss), else null
};

struct DevLayer {
  DevTensor attn_norm, wq, wk, wv, bq, bk, bv, q_norm, k_norm, wo, bo, sinks, ffn_norm, router, router_b;
  DevTensor wq_a, q_a_norm, wq_b, wkv_a, kv_a_norm, wk_b, wv_b;  // MLA
  DevTensor gate_exps, up_exps, down_exps;                      // --local: every expert, uploaded
  DevTensor gate_exps_b, up_exps_b, down_exps_b;
  DevTensor shexp_gate, gate_shexp, up_shexp, down_shexp, ffn_gate, ffn_up, ffn_down;
};

// A device buffer that only grows; growing waits for the stream (a queued kernel may still use it).
struct Buf {
  void* p = nullptr;
  size_t bytes = 0;
  ~Buf() { cudaFree(p); }
  template <typename T>
  expertd::Result<T*> get(size_t n, cudaStream_t s) {
    size_t want = std::max<size_t>(n, 1) * sizeof(T);
    if (want > bytes) {
      CU(cudaStreamSynchronize(s));
      cudaFree(p);
      p = nullptr;
      bytes = 0;
      CU(cudaMalloc(&p, want));
      bytes = want;
    }
    return static_cast<T*>(p);
  }
};

#define TRY_BUF(var, T, buf, n)         \
  T* var;                               \
  {                                     \
    auto _r = (buf).get<T>((n), stream_); \
    if (!_r) return _r.error();         \
    var = *_r;                          \
  }

class CudaEngine final : public Forward {
 public:
  CudaEngine(const Model& m, int n_ctx) : m_(m), n_ctx_(n_ctx) {}
  ~CudaEngine() override {
    if (stream_) cudaStreamSynchronize(stream_);
    slots_.reset();
    client_.reset();
    for (void* p : allocs_) cudaFree(p);
    if (stream_) cudaStreamDestroy(stream_);
  }

  Status init(const std::string& socket) {
    // The routing kernel does softmax -> top-k (-> renormalise); sigmoid gating, selection
    // biases, groups, scaled weights and top-k-then-softmax route on the host (select_experts).
    const Hparams& hp = m_.hp;
    host_routing_ = hp.gating_sigmoid || hp.n_group > 1 || hp.w_scale != 1.0f || m_.arch->topk_then_softmax ||
                    hp.n_expert_used > 32;
    for (const auto& l : m_.layers) host_routing_ |= static_cast<bool>(l.exp_probs_b);
    const int64_t dv = m_.arch->mla ? hp.kv_lora : hp.head_dim;
    if (dv > kernels::cuda::kMaxAttentionDv)
      return make_error("attention values of " + std::to_string(dv) + " floats: the GPU attention kernel takes at most " +
                        std::to_string(kernels::cuda::kMaxAttentionDv));
    int n = 0;
    CU(cudaGetDeviceCount(&n));
    if (n == 0) return make_error("no CUDA device");
    // With a daemon, its GPU (CudaSlots::open selects it); everything below lives there.
    if (!socket.empty()) {
      auto c = connect_daemon(m_, socket, "cuda");
      if (!c) return c.error();
      client_ = std::move(*c);
      auto s = expertd::client::CudaSlots::open(client_->info());
      if (!s) return s.error();
      slots_ = std::move(*s);
      for (const auto& l : client_->info().layers) {
        Roles r{l.find("gate"), l.find("up"), l.find("down"), l.find("gate_bias"), l.find("up_bias"), l.find("down_bias")};
        if (!r[0] || !r[1] || !r[2])
          return make_error("expertd's pack layer for model layer " + std::to_string(l.model_layer) +
                            " has no separate gate, up and down experts (what the GPU engine reads)");
        if (m_.arch->swiglu_oai && (!r[3] || !r[4] || !r[5]))
          return make_error("expertd's pack has no expert biases for model layer " + std::to_string(l.model_layer) +
                            " (gpt-oss experts carry them): rebuild it with this expert-pack");
        roles_.push_back(r);
      }
    }
    int dev = 0;
    CU(cudaGetDevice(&dev));
    cudaDeviceProp prop{};
    CU(cudaGetDeviceProperties(&prop, dev));
    device_name_ = "cuda:" + std::to_string(dev) + " " + prop.name;
    CU(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    for (const Tensor* t : {&m_.output_norm, &m_.output})
      if (!kernels::cuda::weight_type_supported(t->type)) return make_error("unsupported weight type on the GPU");
    EXPERTD_TRY(upload(m_.output_norm, &output_norm_));
    EXPERTD_TRY(upload(m_.output, &output_));
    layers_.resize(m_.layers.size());
    for (size_t il = 0; il < m_.layers.size(); ++il) {
      const LayerWeights& w = m_.layers[il];
      DevLayer& d = layers_[il];
      const std::pair<const Tensor*, DevTensor*> all[] = {
          {&w.attn_norm, &d.attn_norm}, {&w.wq, &d.wq}, {&w.wk, &d.wk}, {&w.wv, &d.wv}, {&w.bq, &d.bq}, {&w.bk, &d.bk},
          {&w.bv, &d.bv}, {&w.q_norm, &d.q_norm}, {&w.k_norm, &d.k_norm}, {&w.wo, &d.wo}, {&w.bo, &d.bo},
          {&w.sinks, &d.sinks}, {&w.ffn_norm, &d.ffn_norm}, {&w.router, &d.router}, {&w.router_b, &d.router_b},
          {&w.wq_a, &d.wq_a}, {&w.q_a_norm, &d.q_a_norm}, {&w.wq_b, &d.wq_b}, {&w.wkv_a, &d.wkv_a},
          {&w.kv_a_norm, &d.kv_a_norm}, {&w.wk_b, &d.wk_b}, {&w.wv_b, &d.wv_b}, {&w.shexp_gate, &d.shexp_gate},
          {&w.gate_shexp, &d.gate_shexp}, {&w.up_shexp, &d.up_shexp}, {&w.down_shexp, &d.down_shexp},
          {&w.ffn_gate, &d.ffn_gate}, {&w.ffn_up, &d.ffn_up}, {&w.ffn_down, &d.ffn_down}};
      for (auto [t, dt] : all) EXPERTD_TRY(upload(*t, dt));
      if (socket.empty() && w.is_moe()) {
        EXPERTD_TRY(upload(w.gate_exps, &d.gate_exps));
        EXPERTD_TRY(upload(w.up_exps, &d.up_exps));
        EXPERTD_TRY(upload(w.down_exps, &d.down_exps));
        EXPERTD_TRY(upload(w.gate_exps_b, &d.gate_exps_b));
        EXPERTD_TRY(upload(w.up_exps_b, &d.up_exps_b));
        EXPERTD_TRY(upload(w.down_exps_b, &d.down_exps_b));
      }
    }
    // MLA caches one latent row per position (head_dim = kv_lora + n_rot, one KV head) that
    // serves as keys and, its first kv_lora floats, as values: no separate V cache.
    const size_t kv = size_t(n_ctx_) * hp.n_head_kv * hp.head_dim * hp.n_layer;
    EXPERTD_TRY(alloc(kv * sizeof(float), reinterpret_cast<void**>(&k_cache_)));
    if (!m_.arch->mla) EXPERTD_TRY(alloc(kv * sizeof(float), reinterpret_cast<void**>(&v_cache_)));
    return {};
  }

  Status eval(std::span<const int32_t> tokens, bool all_logits, std::vector<float>& logits) override {
    const Hparams& hp = m_.hp;
    const int T = static_cast<int>(tokens.size()), E = hp.n_embd, D = hp.head_dim, H = hp.n_head;
    if (T == 0) return make_error("no tokens to evaluate");
    if (n_past_ + T > n_ctx_)
      return make_error("context full: " + std::to_string(n_past_ + T) + " tokens exceed the context of " + std::to_string(n_ctx_));
    for (int32_t tok : tokens)
      if (tok < 0 || tok >= hp.n_vocab) return make_error("token id " + std::to_string(tok) + " is outside the vocabulary");
    // Embeddings: dequantized on the host (one row per token), uploaded.
    std::vector<float> xh(size_t(T) * E);
    const size_t emb_row = kernels::row_size(m_.tok_embd.type, E);
    for (int t = 0; t < T; ++t) kernels::dequantize_row(m_.tok_embd.type, m_.tok_embd.data + emb_row * tokens[t], &xh[size_t(t) * E], E);
    TRY_BUF(x, float, b_x_, size_t(T) * E);
    TRY_BUF(h, float, b_h_, size_t(T) * E);
    TRY_BUF(tmp, float, b_tmp_, size_t(T) * E);
    TRY_BUF(att, float, b_att_, size_t(T) * H * std::max(D, hp.v_mla));
    CU(cudaMemcpyAsync(x, xh.data(), xh.size() * sizeof(float), cudaMemcpyHostToDevice, stream_));
    for (int il = 0; il < hp.n_layer; ++il) {
      const DevLayer& w = layers_[il];
      CU(kernels::cuda::rms_norm(x, w.attn_norm.f32(), h, E, T, hp.eps, stream_));
      if (m_.arch->mla) EXPERTD_TRY(attention_mla(il, T, h, att));
      else EXPERTD_TRY(attention(il, T, h, att));
      EXPERTD_TRY(mm(w.wo, att, T, tmp));
      if (w.bo) CU(kernels::cuda::add_rows(tmp, w.bo.f32(), E, T, stream_));
      CU(kernels::cuda::add(x, tmp, int64_t(T) * E, stream_));
      CU(kernels::cuda::rms_norm(x, w.ffn_norm.f32(), h, E, T, hp.eps, stream_));
      if (m_.layers[il].is_moe()) {
        if (prefetch_) EXPERTD_TRY(prefetch_next(il, T, x));
        EXPERTD_TRY(moe(il, T, h, tmp));
      } else {
        EXPERTD_TRY(ffn(w.ffn_gate, w.ffn_up, w.ffn_down, T, h, tmp));
      }
      CU(kernels::cuda::add(x, tmp, int64_t(T) * E, stream_));
    }
    n_past_ += T;
    const int first = all_logits ? 0 : T - 1, rows = T - first;
    CU(kernels::cuda::rms_norm(x + size_t(first) * E, output_norm_.f32(), h, E, rows, hp.eps, stream_));
    TRY_BUF(lg, float, b_logits_, size_t(rows) * hp.n_vocab);
    EXPERTD_TRY(mm(output_, h, rows, lg));
    logits.resize(size_t(rows) * hp.n_vocab);
    CU(cudaMemcpyAsync(logits.data(), lg, logits.size() * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    CU(cudaStreamSynchronize(stream_));
    return {};
  }

  int n_past() const override { return n_past_; }
  int n_ctx() const override { return n_ctx_; }
  void reset() override { n_past_ = 0; }
  void set_prefetch(bool on) override { prefetch_ = on; }
  std::string experts_name() const override { return client_ ? "daemon" : "local"; }
  std::vector<expertd::proto::Metric> daemon_metrics() override {
    if (!client_) return {};
    auto m = client_->stats();
    return m ? std::move(*m) : std::vector<expertd::proto::Metric>{};
  }
  std::string device_name() const override { return device_name_; }

 private:
  Status alloc(size_t bytes, void** p) {
    CU(cudaMalloc(p, std::max<size_t>(bytes, 1)));
    allocs_.push_back(*p);
    return {};
  }

  Status upload(const Tensor& t, DevTensor* d) {
    if (!t) return {};
    if (!kernels::cuda::weight_type_supported(t.type))
      return make_error("weight type " + std::to_string(t.type) + " is not supported on the GPU");
    const size_t bytes = kernels::row_size(t.type, t.ne[0]) * std::max<int64_t>(t.ne[1], 1) * std::max<int64_t>(t.ne[2], 1);
    void* p = nullptr;
    EXPERTD_TRY(alloc(bytes, &p));
    CU(cudaMemcpy(p, t.data, bytes, cudaMemcpyHostToDevice));
    *d = DevTensor{t.type, t.ne[0], std::max<int64_t>(t.ne[1], 1), static_cast<const uint8_t*>(p)};
    return {};
  }

  // Attention with a KV cache: q/k/v projections (+ biases), q/k norms, RoPE (YaRN), sliding
  // window and sinks where the architecture has them. Writes n_head * head_dim values per token.
  Status attention(int il, int T, const float* h, float* out) {
    const Hparams& hp = m_.hp;
    const DevLayer& w = layers_[il];
    const int D = hp.head_dim, H = hp.n_head, HKV = hp.n_head_kv, Q = H * D, KV = HKV * D;
    TRY_BUF(q, float, b_q_, size_t(T) * Q);
    TRY_BUF(k, float, b_k_, size_t(T) * KV);
    TRY_BUF(v, float, b_v_, size_t(T) * KV);
    EXPERTD_TRY(mm(w.wq, h, T, q));
    EXPERTD_TRY(mm(w.wk, h, T, k));
    EXPERTD_TRY(mm(w.wv, h, T, v));
    if (w.bq) {
      CU(kernels::cuda::add_rows(q, w.bq.f32(), Q, T, stream_));
      CU(kernels::cuda::add_rows(k, w.bk.f32(), KV, T, stream_));
      CU(kernels::cuda::add_rows(v, w.bv.f32(), KV, T, stream_));
    }
    if (m_.arch->qk_norm == QkNorm::Full) {
      CU(kernels::cuda::rms_norm(q, w.q_norm.f32(), q, Q, T, hp.eps, stream_));
      CU(kernels::cuda::rms_norm(k, w.k_norm.f32(), k, KV, T, hp.eps, stream_));
    } else if (w.q_norm) {  // per head
      CU(kernels::cuda::rms_norm(q, w.q_norm.f32(), q, D, int64_t(T) * H, hp.eps, stream_));
      CU(kernels::cuda::rms_norm(k, w.k_norm.f32(), k, D, int64_t(T) * HKV, hp.eps, stream_));
    }
    const kernels::Yarn* yarn = hp.yarn ? &hp.yarn_params : nullptr;
    CU(kernels::cuda::rope(q, T, H, D, hp.n_rot, n_past_, hp.rope_base, m_.arch->rope_neox, yarn, stream_));
    CU(kernels::cuda::rope(k, T, HKV, D, hp.n_rot, n_past_, hp.rope_base, m_.arch->rope_neox, yarn, stream_));
    float* kl = k_cache_ + size_t(il) * n_ctx_ * KV;
    float* vl = v_cache_ + size_t(il) * n_ctx_ * KV;
    CU(cudaMemcpyAsync(kl + size_t(n_past_) * KV, k, size_t(T) * KV * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
    CU(cudaMemcpyAsync(vl + size_t(n_past_) * KV, v, size_t(T) * KV * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
    kernels::cuda::Attention a;
    a.q = q, a.k = kl, a.v = vl, a.out = out, a.n_tokens = T, a.n_past = n_past_, a.n_head = H, a.n_head_kv = HKV;
    a.dk = a.dv = D, a.k_row = a.v_row = KV, a.scale = 1.0f / std::sqrt(float(D));
    a.window = m_.arch->swa_period && il % m_.arch->swa_period == 0 ? hp.swa : 0;
    a.sinks = w.sinks ? w.sinks.f32() : nullptr;
    CU(kernels::cuda::attention(a, stream_));
    return {};
  }

  // Multi-head latent attention the absorbed way, as the CPU engine (Engine::attention_mla): each
  // head's query taken into the latent space with attn_k_b, attention over the cached latent rows
  // (keys: whole rows, values: their first kv_lora floats), attn_v_b back out per head. Writes
  // n_head * v_mla values per token.
  Status attention_mla(int il, int T, const float* h, float* out) {
    const Hparams& hp = m_.hp;
    const DevLayer& w = layers_[il];
    const int H = hp.n_head, R = hp.n_rot, C = hp.kv_lora, KL = C + R, KM = hp.k_mla, nope = KM - R, VM = hp.v_mla;
    TRY_BUF(q, float, b_q_, size_t(T) * H * KM);
    if (w.wq_a) {
      TRY_BUF(qa, float, b_qa_, size_t(T) * hp.q_lora);
      EXPERTD_TRY(mm(w.wq_a, h, T, qa));
      CU(kernels::cuda::rms_norm(qa, w.q_a_norm.f32(), qa, hp.q_lora, T, hp.eps, stream_));
      EXPERTD_TRY(mm(w.wq_b, qa, T, q));
    } else {
      EXPERTD_TRY(mm(w.wq, h, T, q));
    }
    // The new latent rows go straight into the cache: kv_a's output, its first kv_lora floats
    // normalised in place, its last n_rot rotated.
    const kernels::Yarn* yarn = hp.yarn ? &hp.yarn_params : nullptr;
    float* cache = k_cache_ + size_t(il) * n_ctx_ * KL;
    float* rows = cache + size_t(n_past_) * KL;
    EXPERTD_TRY(mm(w.wkv_a, h, T, rows));
    CU(kernels::cuda::rms_norm_strided(rows, KL, w.kv_a_norm.f32(), rows, KL, C, T, hp.eps, stream_));
    CU(kernels::cuda::rope(rows + C, T, 1, KL, R, n_past_, hp.rope_base, m_.arch->rope_neox, yarn, stream_));
    CU(kernels::cuda::rope(q + nope, T, H, KM, R, n_past_, hp.rope_base, m_.arch->rope_neox, yarn, stream_));
    // Full queries [k_b[h] . q_nope, q_pe] per (token, head): KL floats each.
    TRY_BUF(qf, float, b_qf_, size_t(T) * H * KL);
    TRY_BUF(xin, float, b_mla_in_, size_t(T) * std::max(nope, C));
    TRY_BUF(yout, float, b_mla_out_, size_t(T) * std::max(C, VM));
    const size_t f = sizeof(float);
    CU(cudaMemcpy2DAsync(qf + C, KL * f, q + nope, KM * f, R * f, size_t(T) * H, cudaMemcpyDeviceToDevice, stream_));
    for (int hh = 0; hh < H; ++hh) {
      CU(cudaMemcpy2DAsync(xin, nope * f, q + size_t(hh) * KM, size_t(H) * KM * f, nope * f, T, cudaMemcpyDeviceToDevice, stream_));
      EXPERTD_TRY(mm(head_of(w.wk_b, hh), xin, T, yout));
      CU(cudaMemcpy2DAsync(qf + size_t(hh) * KL, size_t(H) * KL * f, yout, C * f, C * f, T, cudaMemcpyDeviceToDevice, stream_));
    }
    TRY_BUF(lat, float, b_lat_, size_t(T) * H * C);
    kernels::cuda::Attention a;
    a.q = qf, a.k = cache, a.v = cache, a.out = lat, a.n_tokens = T, a.n_past = n_past_, a.n_head = H, a.n_head_kv = 1;
    a.dk = KL, a.dv = C, a.k_row = a.v_row = KL, a.scale = hp.mla_mscale * hp.mla_mscale / std::sqrt(float(KM));
    CU(kernels::cuda::attention(a, stream_));
    for (int hh = 0; hh < H; ++hh) {
      CU(cudaMemcpy2DAsync(xin, C * f, lat + size_t(hh) * C, size_t(H) * C * f, C * f, T, cudaMemcpyDeviceToDevice, stream_));
      EXPERTD_TRY(mm(head_of(w.wv_b, hh), xin, T, yout));
      CU(cudaMemcpy2DAsync(out + size_t(hh) * VM, size_t(H) * VM * f, yout, VM * f, VM * f, T, cudaMemcpyDeviceToDevice, stream_));
    }
    return {};
  }

  // Before a layer's experts are fetched, hints the next MoE layer's likely experts to expertd:
  // the next router applied to the current residual stream, its top-k by raw logits (as the CPU
  // engine's prefetch_next; DESIGN.md, "Overlap"). Hints never change the math.
  Status prefetch_next(int il, int T, const float* x) {
    const Hparams& hp = m_.hp;
    if (!client_ || il + 1 >= hp.n_layer || !m_.layers[il + 1].is_moe()) return {};
    const int pl = client_->info().pack_layer_of(static_cast<uint32_t>(il + 1));
    if (pl < 0) return {};
    const DevLayer& next = layers_[il + 1];
    const int E = hp.n_embd, X = hp.n_expert, K = hp.n_expert_used;
    TRY_BUF(hn, float, b_pf_h_, size_t(T) * E);
    TRY_BUF(lg, float, b_pf_lg_, size_t(T) * X);
    CU(kernels::cuda::rms_norm(x, next.ffn_norm.f32(), hn, E, T, hp.eps, stream_));
    EXPERTD_TRY(mm(next.router, hn, T, lg));
    std::vector<float> hl(size_t(T) * X);
    CU(cudaMemcpyAsync(hl.data(), lg, hl.size() * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    CU(cudaStreamSynchronize(stream_));
    // A hint: the daemon may decline it.
    (void)client_->prefetch(static_cast<uint32_t>(pl), likely_experts(hl.data(), T, X, K));
    return {};
  }

  // Head hh's matrix of a per-head 3D weight (one ne0 x ne1 matrix per head).
  static DevTensor head_of(const DevTensor& t, int hh) {
    DevTensor s = t;
    s.data = t.data + kernels::row_size(t.type, t.ne0) * t.ne1 * hh;
    return s;
  }

  Status mm(const DevTensor& w, const float* x, int T, float* y) {
    CU(kernels::cuda::matmul(w.type, w.data, w.ne1, w.ne0, x, T, y, stream_));
    return {};
  }

  Status ffn(const DevTensor& g, const DevTensor& u, const DevTensor& d, int T, const float* h, float* out) {
    const int64_t F = g.ne1;
    TRY_BUF(a, float, b_g_, size_t(T) * F);
    TRY_BUF(b, float, b_u_, size_t(T) * F);
    EXPERTD_TRY(mm(g, h, T, a));
    EXPERTD_TRY(mm(u, h, T, b));
    CU(kernels::cuda::swiglu(a, b, a, int64_t(T) * F, stream_));
    return mm(d, a, T, out);
  }

  // One expert on the tokens routed to it: gather, gate/up, SwiGLU, down, scatter to (token, k) rows.
  Status run_expert(const DevExpert& ew, const float* h, int32_t* d_src, int32_t* d_dst, int n, float* eo) {
    const int E = m_.hp.n_embd;
    const int64_t F = ew.gate.ne1;
    TRY_BUF(xs, float, b_xs_, size_t(n) * E);
    TRY_BUF(g, float, b_eg_, size_t(n) * F);
    TRY_BUF(u, float, b_eu_, size_t(n) * F);
    TRY_BUF(ys, float, b_ys_, size_t(n) * E);
    CU(kernels::cuda::gather_rows(h, d_src, xs, n, E, stream_));
    EXPERTD_TRY(mm(ew.gate, xs, n, g));
    EXPERTD_TRY(mm(ew.up, xs, n, u));
    if (ew.gate_b) {
      CU(kernels::cuda::add_rows(g, ew.gate_b.f32(), F, n, stream_));
      CU(kernels::cuda::add_rows(u, ew.up_b.f32(), F, n, stream_));
    }
    if (m_.arch->swiglu_oai) CU(kernels::cuda::swiglu_oai(g, u, g, int64_t(n) * F, stream_));
    else CU(kernels::cuda::swiglu(g, u, g, int64_t(n) * F, stream_));
    EXPERTD_TRY(mm(ew.down, g, n, ys));
    if (ew.down_b) CU(kernels::cuda::add_rows(ys, ew.down_b.f32(), E, n, stream_));
    CU(kernels::cuda::scatter_rows(ys, d_dst, eo, n, E, stream_));
    return {};
  }

  DevExpert slot_expert(uint32_t pack_layer, uint32_t slot) const {
    const auto& r = roles_[pack_layer];
    const uint8_t* base = slots_->slot_ptr(slot);
    auto role = [&](const expertd::client::RoleView* v) {
      if (!v) return DevTensor{};  // an optional role (bias) this pack does not have
      return DevTensor{v->ggml_type, static_cast<int64_t>(v->ne0), std::max<int64_t>(int64_t(v->ne1), 1), base + v->offset};
    };
    return {role(r[0]), role(r[1]), role(r[2]), role(r[3]), role(r[4]), role(r[5])};
  }

  DevExpert local_expert(const DevLayer& w, uint32_t e) const {
    auto slice = [&](const DevTensor& t) {
      if (!t) return DevTensor{};
      DevTensor s = t;
      s.data = t.data + kernels::row_size(t.type, t.ne0) * t.ne1 * e;
      return s;
    };
    // The biases are (n) x n_expert: one row per expert.
    auto bias = [&](const DevTensor& t) {
      if (!t) return DevTensor{};
      return DevTensor{t.type, t.ne0, 1, t.data + kernels::row_size(t.type, t.ne0) * e};
    };
    return {slice(w.gate_exps), slice(w.up_exps), slice(w.down_exps),
            bias(w.gate_exps_b), bias(w.up_exps_b), bias(w.down_exps_b)};
  }

  Status moe(int il, int T, const float* h, float* out) {
    const Hparams& hp = m_.hp;
    const DevLayer& w = layers_[il];
    const int E = hp.n_embd, X = hp.n_expert, K = hp.n_expert_used;
    TRY_BUF(lg, float, b_router_, size_t(T) * X);
    TRY_BUF(ids, int32_t, b_ids_, size_t(T) * K);
    TRY_BUF(wts, float, b_wts_, size_t(T) * K);
    EXPERTD_TRY(mm(w.router, h, T, lg));
    if (w.router_b) CU(kernels::cuda::add_rows(lg, w.router_b.f32(), X, T, stream_));
    std::vector<int32_t> hids(size_t(T) * K);
    if (!host_routing_) {
      CU(kernels::cuda::softmax_topk(lg, T, X, K, hp.norm_topk, ids, wts, stream_));
      CU(cudaMemcpyAsync(hids.data(), ids, hids.size() * sizeof(int32_t), cudaMemcpyDeviceToHost, stream_));
      CU(cudaStreamSynchronize(stream_));
    } else {  // the CPU engine's routing on the GPU's logits
      std::vector<float> hl(size_t(T) * X), hw(size_t(T) * K);
      CU(cudaMemcpyAsync(hl.data(), lg, hl.size() * sizeof(float), cudaMemcpyDeviceToHost, stream_));
      CU(cudaStreamSynchronize(stream_));
      Route r;
      for (int t = 0; t < T; ++t) {
        select_experts(m_, m_.layers[il], &hl[size_t(t) * X], r);
        for (int k = 0; k < K; ++k) hids[size_t(t) * K + k] = static_cast<int32_t>(r.experts[k]), hw[size_t(t) * K + k] = r.weights[k];
      }
      // From pageable memory: CUDA has taken the bytes when the call returns, so hw may go.
      CU(cudaMemcpyAsync(wts, hw.data(), hw.size() * sizeof(float), cudaMemcpyHostToDevice, stream_));
    }
    // Tokens of each unique expert: source rows (tokens) and destination rows (token * K + k).
    std::map<uint32_t, std::pair<std::vector<int32_t>, std::vector<int32_t>>> users;
    for (int t = 0; t < T; ++t)
      for (int k = 0; k < K; ++k) {
        auto& u = users[static_cast<uint32_t>(hids[size_t(t) * K + k])];
        u.first.push_back(t);
        u.second.push_back(t * K + k);
      }
    std::vector<uint32_t> unique;
    std::vector<int32_t> idx_host;  // per expert: its sources then its destinations
    std::vector<size_t> idx_at;
    for (auto& [e, u] : users) {
      unique.push_back(e);
      idx_at.push_back(idx_host.size());
      idx_host.insert(idx_host.end(), u.first.begin(), u.first.end());
      idx_host.insert(idx_host.end(), u.second.begin(), u.second.end());
    }
    TRY_BUF(d_idx, int32_t, b_idx_, idx_host.size());
    CU(cudaMemcpyAsync(d_idx, idx_host.data(), idx_host.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
    TRY_BUF(eo, float, b_eo_, size_t(T) * K * E);
    auto run = [&](size_t ui, const DevExpert& ew) {
      const int n = static_cast<int>(users[unique[ui]].first.size());
      return run_expert(ew, h, d_idx + idx_at[ui], d_idx + idx_at[ui] + n, n, eo);
    };
    if (!client_) {
      for (size_t ui = 0; ui < unique.size(); ++ui) EXPERTD_TRY(run(ui, local_expert(w, unique[ui])));
    } else {
      EXPERTD_TRY(daemon_experts(il, unique, run));
    }
    CU(kernels::cuda::weighted_sum(eo, wts, out, T, K, E, stream_));
    if (w.gate_shexp) {
      TRY_BUF(shared, float, b_shared_, size_t(T) * E);
      EXPERTD_TRY(ffn(w.gate_shexp, w.up_shexp, w.down_shexp, T, h, shared));
      float* gate = nullptr;
      if (w.shexp_gate) {
        TRY_BUF(g, float, b_shgate_, size_t(T));
        EXPERTD_TRY(mm(w.shexp_gate, h, T, g));
        gate = g;
      }
      CU(kernels::cuda::add_gated(out, shared, gate, E, T, stream_));
    }
    return {};
  }

  // Experts from the daemon's VRAM slots: hits at once (the stream waits on their events, a no-op
  // for long-finished copies), misses as their Ready messages arrive. A lease is released only
  // after the stream finished reading its slots (CudaSlots' contract).
  template <typename Run>
  Status daemon_experts(int il, const std::vector<uint32_t>& unique, Run& run) {
    const auto& info = client_->info();
    const int pl = info.pack_layer_of(static_cast<uint32_t>(il));
    if (pl < 0) return make_error("expertd's pack has no experts for model layer " + std::to_string(il));
    const size_t max = info.max_experts_per_request;
    for (size_t base = 0; base < unique.size(); base += max) {
      std::span<const uint32_t> chunk(unique.data() + base, std::min(max, unique.size() - base));
      auto lease = client_->acquire(static_cast<uint32_t>(pl), chunk);
      if (!lease) return lease.error();
      auto fail = [&](const expertd::Error& e) {
        cudaStreamSynchronize(stream_);
        (void)client_->release(*lease);
        return e;
      };
      auto go = [&](size_t i) -> Status {
        EXPERTD_TRY(slots_->wait(stream_, lease->slots[i]));
        return run(base + i, slot_expert(static_cast<uint32_t>(pl), lease->slots[i]));
      };
      for (size_t i = 0; i < chunk.size(); ++i)
        if (lease->ready[i])
          if (auto st = go(i); !st) return fail(st.error());
      for (;;) {
        auto next = client_->next_ready(*lease);
        if (!next) return fail(next.error());
        if (!next->has_value()) break;
        size_t i = **next;
        if (!lease->errors[i].empty())
          return fail(make_error("expert " + std::to_string(chunk[i]) + " of layer " + std::to_string(il) + ": " + lease->errors[i]));
        if (auto st = go(i); !st) return fail(st.error());
      }
      CU(cudaStreamSynchronize(stream_));
      EXPERTD_TRY(client_->release(*lease));
    }
    return {};
  }

  const Model& m_;
  int n_ctx_, n_past_ = 0;
  bool prefetch_ = false;
  std::string device_name_;
  cudaStream_t stream_ = nullptr;
  std::vector<void*> allocs_;
  DevTensor output_norm_, output_;
  std::vector<DevLayer> layers_;
  float *k_cache_ = nullptr, *v_cache_ = nullptr;
  Buf b_x_, b_h_, b_tmp_, b_q_, b_k_, b_v_, b_att_, b_logits_, b_g_, b_u_, b_xs_, b_eg_, b_eu_, b_ys_, b_router_, b_ids_,
      b_wts_, b_idx_, b_eo_, b_shared_, b_shgate_, b_qa_, b_lat_, b_qf_, b_mla_in_, b_mla_out_, b_pf_h_, b_pf_lg_;
  bool host_routing_ = false;
  std::unique_ptr<expertd::client::Client> client_;
  std::unique_ptr<expertd::client::CudaSlots> slots_;
  // gate, up, down and their biases (null when absent) per pack layer
  using Roles = std::array<const expertd::client::RoleView*, 6>;
  std::vector<Roles> roles_;
};

}  // namespace

expertd::Result<std::unique_ptr<Forward>> make_cuda_forward(const Model& m, const std::string& socket, int n_ctx) {
  auto e = std::make_unique<CudaEngine>(m, n_ctx);
  if (auto st = e->init(socket); !st) return make_error("--device cuda: " + st.error().message);
  return std::unique_ptr<Forward>(std::move(e));
}

}  // namespace engine
