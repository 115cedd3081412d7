// The CUDA backend (expert-run --device cuda): the model's weights uploaded to VRAM once and
// found by their host address, the KV cache and activations in VRAM, every op a launch of
// kernels/cuda/ on one stream. Experts come through the one fetch path (engine/moe.cpp,
// engine/expert_source.cpp): uploaded with the model (--local) or a cuda expertd's slots, read
// in place after the stream waits on the slot's event (CudaSlotMemory below). Activations stay
// float32 (weights are dequantized inside the matmuls), so logits differ from the CPU backend
// by rounding; routing and greedy tokens agree where the golden data's margins allow.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "client/cuda_slots.h"
#include "engine/arena.h"
#include "engine/cuda_engine.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/kernels.h"

namespace engine {

using expertd::make_error;
using expertd::Status;

namespace {

std::string cuda_error(const char* what, cudaError_t e) {
  return std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}

class CudaOps final : public Ops {
 public:
  CudaOps() : arena_([this](size_t n) { return device_alloc(n); }, [](float* p) { cudaFree(p); }) {}
  ~CudaOps() override {
    if (stream_) cudaStreamSynchronize(stream_);
    for (void* p : allocs_) cudaFree(p);
    if (staged_) cudaFreeHost(staged_);
    if (staged_read_) cudaEventDestroy(staged_read_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  Status init() {
    int n = 0;
    if (auto e = cudaGetDeviceCount(&n); e != cudaSuccess)
      return make_error(cuda_error("cudaGetDeviceCount", e));
    if (n == 0) return make_error("no CUDA device");
    int dev = 0;
    cudaDeviceProp prop{};
    if (auto e = cudaGetDevice(&dev); e != cudaSuccess)
      return make_error(cuda_error("cudaGetDevice", e));
    if (auto e = cudaGetDeviceProperties(&prop, dev); e != cudaSuccess)
      return make_error(cuda_error("cudaGetDeviceProperties", e));
    name_ = "cuda:" + std::to_string(dev) + " " + prop.name;
    if (auto e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking); e != cudaSuccess)
      return make_error(cuda_error("cudaStreamCreate", e));
    return {};
  }

  // Uploads every tensor the forward pass reads (the token embeddings only when the output
  // shares them: embeddings are looked up on the host). `experts`: the routed experts too.
  Status place(const Model& m, bool experts) {
    experts_placed_ = experts;
    by_weight_.assign(m.weights.size(), {});
    for (size_t i = 0; i < m.weights.size(); ++i) {
      const Tensor& t = m.weights[i];
      const bool expert = m.is_routed_experts(t);
      if ((expert && !experts) || (t.data == m.tok_embd.data && m.output.data != m.tok_embd.data))
        continue;
      if (t.type == kernels::I32) continue;                       // tables stay on the host
      if (auto it = placed_.find(t.data); it != placed_.end()) {  // shared bytes: one copy
        by_weight_[i] = it->second;
        continue;
      }
      if (!kernels::cuda::weight_type_supported(t.type))
        return make_error(
            std::string("weight type ") +
            (kernels::type_traits(t.type) ? kernels::type_traits(t.type)->name : "?") +
            " is not supported on the GPU (" + kernels::cuda_type_names() + ")");
      void* p = nullptr;
      if (auto e = cudaMalloc(&p, std::max<size_t>(t.bytes(), 1)); e != cudaSuccess)
        return make_error(cuda_error("cudaMalloc", e));
      allocs_.push_back(p);
      if (auto e = cudaMemcpy(p, t.data, t.bytes(), cudaMemcpyHostToDevice); e != cudaSuccess)
        return make_error(cuda_error("cudaMemcpy", e));
      by_weight_[i] = placed_[t.data] = {t.data, t.bytes(), static_cast<const uint8_t*>(p)};
    }
    return {};
  }

  cudaStream_t stream() const { return stream_; }
  std::string name() const override { return name_; }
  Status status() const override { return status_; }

  Act alloc(int64_t rows, int64_t cols) override {
    float* p = ok() ? arena_.alloc(size_t(rows * cols)) : nullptr;
    if (!p && ok())
      fail(make_error("out of GPU memory for " + std::to_string(rows * cols) + " activations"));
    return {p, rows, cols};
  }
  size_t mark() const override { return arena_.mark(); }
  void release_to(size_t mark) override { arena_.release_to(mark); }
  void consolidate() override {
    cudaStreamSynchronize(stream_);  // the arena may free blocks the stream still reads
    arena_.consolidate();
  }

  void init_cache(const std::vector<KvRows>& layers, int n_ctx, int n_slots, KvType type) override {
    if (type != KvType::F32)
      return fail(make_error(std::string("the CUDA backend keeps its KV cache in f32, not ") +
                             kv_type_name(type) + " (--kv-type f16 is the CPU backend's)"));
    n_ctx_ = n_ctx, n_layer_ = int(layers.size());
    cache_.resize(layers.size() * size_t(n_slots));
    auto buffer = [&](int64_t floats) {
      return floats ? static_cast<float*>(device_buffer(size_t(floats) * sizeof(float))) : nullptr;
    };
    for (size_t i = 0; i < cache_.size(); ++i) {  // slot-major
      const KvRows& rows = layers[i % layers.size()];
      cache_[i].rows = rows;
      cache_[i].k = buffer(int64_t{n_ctx} * rows.k);
      cache_[i].v = buffer(int64_t{n_ctx} * rows.v);
      cache_[i].state = buffer(rows.state);
      cache_[i].kv_state = buffer(rows.kv_state);
    }
  }

  // A sequence's caches to the host and back (prefix reuse), in Ops::save_slot's layout: per
  // layer the key and value rows of the first n positions, the kv_state, the state.
  bool save_slot(int slot, int64_t n, std::vector<uint8_t>& out, int first_layer = 0) override {
    if (!ok()) return false;
    out.clear();
    auto put = [&](const float* d, int64_t floats) {
      const size_t at = out.size();
      out.resize(at + size_t(floats) * sizeof(float));
      if (floats)
        check("save state", cudaMemcpyAsync(out.data() + at, d, size_t(floats) * sizeof(float),
                                            cudaMemcpyDeviceToHost, stream_));
    };
    for (int il = first_layer; il < n_layer_; ++il) {
      const Cache& c = cache(slot, il);
      put(c.k, n * c.rows.k), put(c.v, n * c.rows.v), put(c.kv_state, c.rows.kv_state),
          put(c.state, c.rows.state);
    }
    if (ok()) check("cudaStreamSynchronize", cudaStreamSynchronize(stream_));
    return ok();
  }

  bool load_slot(int slot, int64_t n_saved, int64_t n, std::span<const uint8_t> in,
                 int first_layer = 0) override {
    if (!ok()) return false;
    size_t at = 0;
    // `floats` of the copy into d, then past `saved` of them
    auto get = [&](float* d, int64_t floats, int64_t saved) {
      const size_t bytes = size_t(saved) * sizeof(float);
      if (at + bytes > in.size()) return false;
      if (floats)
        check("load state", cudaMemcpyAsync(d, in.data() + at, size_t(floats) * sizeof(float),
                                            cudaMemcpyHostToDevice, stream_));
      at += bytes;
      return true;
    };
    for (int il = first_layer; il < n_layer_; ++il) {
      Cache& c = cache(slot, il);
      if (!get(c.k, n * c.rows.k, n_saved * c.rows.k) ||
          !get(c.v, n * c.rows.v, n_saved * c.rows.v) ||
          !get(c.kv_state, c.rows.kv_state, c.rows.kv_state) ||
          !get(c.state, c.rows.state, c.rows.state))
        return false;
    }
    // The copies read `in` (pageable host memory the caller may free): finished before return.
    if (ok()) check("cudaStreamSynchronize", cudaStreamSynchronize(stream_));
    return ok() && at == in.size();
  }

  // Embeddings: dequantized on the host (one row per token), uploaded.
  void embed(const Tensor& emb, std::span<const int32_t> tokens, Act x) override {
    if (!ok()) return;  // x may be unallocated
    std::vector<float> h(size_t(x.rows) * x.cols);
    for (size_t t = 0; t < tokens.size(); ++t)
      kernels::dequantize_row(emb.type, emb.data + emb.row_bytes() * tokens[t], &h[t * x.cols],
                              x.cols);
    // From pageable memory: CUDA has taken the bytes when the call returns.
    check("upload embeddings", cudaMemcpyAsync(x.data, h.data(), h.size() * sizeof(float),
                                               cudaMemcpyHostToDevice, stream_));
  }

  void to_host(Act x, float* dst) override {
    if (!ok()) return;
    check("download", cudaMemcpyAsync(dst, x.data, sizeof(float) * x.rows * x.cols,
                                      cudaMemcpyDeviceToHost, stream_));
    check("cudaStreamSynchronize", cudaStreamSynchronize(stream_));
  }
  void from_host(const float* src, Act x) override {
    if (!ok()) return;  // From pageable memory: CUDA has taken the bytes when the call returns.
    check("upload", cudaMemcpyAsync(x.data, src, sizeof(float) * x.rows * x.cols,
                                    cudaMemcpyHostToDevice, stream_));
  }

  // A column view is gathered into whole rows first (and the product scattered into one).
  void matmul(const Tensor& w, Cols x, Cols y) override {
    const uint8_t* d = dev(w);
    if (!d) return;
    const size_t mark = arena_.mark();
    Act xs = x.whole() ? x.a : alloc(x.rows(), x.n), ys = y.whole() ? y.a : alloc(y.rows(), y.n);
    if (!x.whole()) copy(xs, x);
    if (ok())
      check("matmul",
            kernels::cuda::matmul(w.type, d, w.ne[1], w.ne[0], xs.data, xs.rows, ys.data, stream_));
    if (!y.whole()) copy(y, ys);
    arena_.release_to(mark);  // the stream orders a later use of this memory after these
  }
  void add_bias(Act y, const Tensor& b) override {
    if (const uint8_t* d = dev(b))
      check("add_rows", kernels::cuda::add_rows(y.data, reinterpret_cast<const float*>(d), y.cols,
                                                y.rows, stream_));
  }
  void add(Act y, Act x) override {
    if (ok()) check("add", kernels::cuda::add(y.data, x.data, y.rows * y.cols, stream_));
  }
  void rms_norm(Cols x, const Tensor& w, Cols y, float eps, int64_t n) override {
    if (n == 0) n = x.n;
    const float* d = w ? dev_f32(w) : nullptr;  // no weight: the plain normalisation
    if (x.whole() && y.whole()) {               // each group a row
      if (ok())
        check("rms_norm", kernels::cuda::rms_norm(x.a.data, d, y.a.data, n, x.rows() * (x.n / n),
                                                  eps, stream_));
      return;
    }
    for (int64_t g = 0; g < x.n && ok(); g += n)
      check("rms_norm", kernels::cuda::rms_norm_strided(x.data() + g, x.stride(), d, y.data() + g,
                                                        y.stride(), n, x.rows(), eps, stream_));
  }
  void layer_norm(Act x, const Tensor& w, const Tensor& b, Act y, float eps) override {
    const float* dw = w ? dev_f32(w) : nullptr;
    const float* db = b ? dev_f32(b) : nullptr;
    if (ok())
      check("layer_norm",
            kernels::cuda::layer_norm(x.data, dw, db, y.data, x.cols, x.rows, eps, stream_));
  }
  void rope_at(Act x, int64_t stride, int64_t offset, int64_t n_rot, int64_t pos0,
               const RopeOpts& o) override {
    if (ok())
      check("rope", kernels::cuda::rope(x.data + offset, x.rows, x.cols / stride, stride, n_rot,
                                        pos0, o.base, o.neox, o.yarn, stream_, o.inverse,
                                        o.freq_factors ? dev_f32(o.freq_factors) : nullptr));
  }

  // The factors uploaded (from pageable memory: taken when the call returns), then a row scale.
  void scale_rows(Act x, std::span<const float> f) override {
    Act d = alloc(x.rows, 1);
    if (!ok()) return;
    check("upload scales", cudaMemcpyAsync(d.data, f.data(), size_t(x.rows) * sizeof(float),
                                           cudaMemcpyHostToDevice, stream_));
    if (ok())
      check("scale_rows", kernels::cuda::scale_rows(x.data, d.data, x.cols, x.rows, stream_));
  }

  void attn_temperature_at(Act x, int64_t pos0, const AttnTemp& t) override {
    if (ok())
      check("attn_temperature",
            kernels::cuda::attn_temperature(x.data, x.rows, x.cols, pos0, t.scale, t.offset,
                                            t.length, stream_));
  }

  void attention_at(int slot, int il, Act q, Act k, Act v, int64_t pos0, const AttnOpts& o,
                    Act out) override {
    if (!ok()) return;
    if (!check_dv(o.dv())) return;
    Cache& c = cache(slot, il);
    const int64_t KV = o.n_head_kv * o.head_dim, KR = c.rows.k;  // KR: with an indexer's key
    const int64_t VV = o.n_head_kv * o.dv();
    const size_t f = sizeof(float);
    check("cache k", cudaMemcpy2DAsync(c.k + pos0 * KR, KR * f, k.data, KV * f, KV * f,
                                       size_t(k.rows), cudaMemcpyDeviceToDevice, stream_));
    check("cache v", cudaMemcpyAsync(c.v + pos0 * VV, v.data, f * v.rows * VV,
                                     cudaMemcpyDeviceToDevice, stream_));
    kernels::cuda::Attention a;
    a.q = q.data, a.k = c.k, a.v = c.v, a.out = out.data, a.n_tokens = q.rows, a.n_past = pos0,
    a.n_head = o.n_head;
    a.n_head_kv = o.n_head_kv, a.dk = o.head_dim, a.dv = o.dv(), a.k_row = KR, a.v_row = VV,
    a.scale = o.scale, a.window = o.window, a.chunk = o.chunk;
    a.sinks = o.sinks ? reinterpret_cast<const float*>(dev(o.sinks)) : nullptr;
    if (o.blocks.data) {  // block-sparse: per (token, KV head) its blocks' positions, ascending
      const int64_t T = q.rows, per_kv = o.blocks.cols / o.n_head_kv, stride = per_kv * o.block;
      Act lists = alloc(T * o.n_head_kv, stride + 1);  // int32s: the lists, then the counts
      if (!ok()) return;
      int32_t* ids = lists.i32();
      check("block positions", kernels::cuda::msa_block_positions(
                                   o.blocks.i32(), T, o.n_head_kv, per_kv, o.block, pos0, o.window,
                                   ids, ids + T * o.n_head_kv * stride, stride, stream_));
      a.sel = ids, a.sel_n = ids + T * o.n_head_kv * stride, a.sel_stride = stride;
      a.sel_per_kv = true;
    }
    if (ok()) check("attention", kernels::cuda::attention(a, stream_));
  }

  // As the CPU backend: each head's query taken into the latent space with attn_k_b (strided 2-D
  // copies in and out of per-head buffers), attention over the cached latent rows (keys: whole
  // rows, values: their first kv_lora floats), attn_v_b back out per head.
  void attention_mla_at(int slot, int il, Act q, Act kv, const Tensor& wk_b, const Tensor& wv_b,
                        int64_t pos0, const MlaOpts& o, Act out, Act sel) override {
    if (!ok() || !check_dv(o.kv_lora)) return;
    const int64_t T = q.rows, H = o.n_head, R = o.n_rot, C = o.kv_lora, KL = C + R,
                  nope = o.qk_nope, KM = nope + R, VM = o.v_mla;
    const size_t f = sizeof(float);
    float* cache = this->cache(slot, il).k;
    check("cache", cudaMemcpyAsync(cache + pos0 * KL, kv.data, f * T * KL, cudaMemcpyDeviceToDevice,
                                   stream_));
    Act qf = alloc(T, H * KL), xin = alloc(T, std::max(nope, C)), yout = alloc(T, std::max(C, VM)),
        lat = alloc(T, H * C);
    if (!ok()) return;
    check("copy", cudaMemcpy2DAsync(qf.data + C, KL * f, q.data + nope, KM * f, R * f,
                                    size_t(T) * H, cudaMemcpyDeviceToDevice, stream_));
    for (int64_t hh = 0; hh < H; ++hh) {
      check("copy", cudaMemcpy2DAsync(xin.data, nope * f, q.data + hh * KM, H * KM * f, nope * f, T,
                                      cudaMemcpyDeviceToDevice, stream_));
      matmul(wk_b.matrix(hh), {xin.data, T, nope}, {yout.data, T, C});
      check("copy", cudaMemcpy2DAsync(qf.data + hh * KL, H * KL * f, yout.data, C * f, C * f, T,
                                      cudaMemcpyDeviceToDevice, stream_));
    }
    if (o.temp) attn_temperature_at(qf, pos0, o.temp);
    kernels::cuda::Attention a;
    a.q = qf.data, a.k = cache, a.v = cache, a.out = lat.data, a.n_tokens = T, a.n_past = pos0,
    a.n_head = H, a.n_head_kv = 1;
    a.dk = KL, a.dv = C, a.k_row = a.v_row = KL, a.scale = o.scale;
    if (sel.data) {  // each token's selected positions, ascending
      const int64_t stride = std::max<int64_t>(1, sel.cols);
      Act lists = alloc(T, stride + 1);  // int32s: the lists, then the counts
      if (!ok()) return;
      int32_t* ids = lists.i32();
      check("select", kernels::cuda::dsv4_select(sel.i32(), T, pos0, 1, ids, ids + T * stride,
                                                 stride, stream_));
      a.sel = ids, a.sel_n = ids + T * stride, a.sel_stride = stride;
    }
    if (ok()) check("attention", kernels::cuda::attention(a, stream_));
    for (int64_t hh = 0; hh < H; ++hh) {
      check("copy", cudaMemcpy2DAsync(xin.data, C * f, lat.data + hh * C, H * C * f, C * f, T,
                                      cudaMemcpyDeviceToDevice, stream_));
      matmul(wv_b.matrix(hh), {xin.data, T, C}, {yout.data, T, VM});
      check("copy", cudaMemcpy2DAsync(out.data + hh * VM, H * VM * f, yout.data, VM * f, VM * f, T,
                                      cudaMemcpyDeviceToDevice, stream_));
    }
  }

  void ffn(const FfnWeights& w, Act h, Act out) override {
    const int64_t F = w.gate.ne[1];
    Act a = alloc(h.rows, F), b = alloc(h.rows, F);
    matmul(w.gate, h, a);
    matmul(w.up, h, b);
    glu(w.act, a, b);
    matmul(w.down, a, out);
  }

  void copy(Cols dst, Cols src) override {
    if (ok())
      check("copy", cudaMemcpy2DAsync(dst.data(), dst.stride() * sizeof(float), src.data(),
                                      src.stride() * sizeof(float), src.n * sizeof(float),
                                      src.rows(), cudaMemcpyDeviceToDevice, stream_));
  }
  void mul_act(Act y, Act g, Unary f) override {
    if (ok())
      check("mul_act", kernels::cuda::mul_act(y.data, g.data, y.rows * y.cols, int(f),
                                              y.cols / g.cols, stream_));
  }
  void res_mix(Act stack, int n, Act cur, const Tensor& w, float eps, Act out) override {
    if (const float* d = dev_f32(w))
      check("res_mix", kernels::cuda::res_mix(stack.data, n, cur.data, d, out.data, cur.rows,
                                              cur.cols, eps, stream_));
  }
  void delta_rule_at(int slot, int il, const DeltaOpts& o, Act q, Act k, Act v, Act g, Act beta,
                     int64_t pos0, Act out) override {
    if (!ok()) return;
    Cache& c = cache(slot, il);
    if (pos0 == 0)
      check("reset state",
            cudaMemsetAsync(c.state, 0, sizeof(float) * size_t(c.rows.state), stream_));
    kernels::cuda::Delta a;
    a.q = q.data, a.k = k.data, a.v = v.data, a.g = g.data, a.beta = beta.data, a.state = c.state,
    a.out = out.data;
    a.conv_q = dev_f32(o.conv_q), a.conv_k = dev_f32(o.conv_k), a.conv_v = dev_f32(o.conv_v),
    a.a = dev_f32(o.a);
    a.n_tokens = q.rows, a.n_k_head = o.n_k_head, a.n_v_head = o.n_v_head, a.dk = o.dk, a.dv = o.dv,
    a.per_head_decay = o.per_head_decay, a.tiled_heads = o.tiled_heads, a.d_conv = o.d_conv,
    a.lower_bound = o.lower_bound, a.eps = o.eps, a.a_positive = o.a_positive;
    if (ok()) check("delta_rule", kernels::cuda::delta_rule(a, stream_));
  }

  void add_gated(Act y, Act x, const Tensor& gate, Act h) override {
    float* g = nullptr;
    if (gate) {
      Act ga = alloc(h.rows, 1);
      matmul(gate, h, ga);
      g = ga.data;
    }
    if (ok())
      check("add_gated", kernels::cuda::add_gated(y.data, x.data, g, y.cols, y.rows, stream_));
  }

  // DeepSeek-V4: hyper-connections, the grouped output projection, its attention's compressors,
  // indexer and attention on the device.
  void hc_pre(Act x, Act mixes, const HcOpts& o, bool head, Act out, Act pc) override {
    const float *sc = dev_f32(o.scale), *b = dev_f32(o.base);
    if (ok())
      check("hc_pre",
            kernels::cuda::hc_pre(x.data, mixes.data, sc, b, o.hc, o.sinkhorn_iters, o.eps, head,
                                  out.data, pc.data, x.rows, out.cols, stream_));
  }
  void hc_post(Act f, Act x, Act pc, int hc, Act out) override {
    if (ok())
      check("hc_post",
            kernels::cuda::hc_post(f.data, x.data, pc.data, hc, out.data, f.rows, f.cols, stream_));
  }
  void repeat(Act x, int n, Act out) override {
    if (ok())
      check("repeat", kernels::cuda::repeat_rows(x.data, n, out.data, x.rows, x.cols, stream_));
  }
  // A DeepSeek-V4 layer's cache: the compressors' pending rows in the state, the window ring then
  // the compressors' entries in the kv_state.
  struct Dsv4Layout {
    float *comp_st = nullptr, *idx_st = nullptr, *ring = nullptr, *entries = nullptr,
          *idx_entries = nullptr;
  };
  Dsv4Layout dsv4_layout(int slot, int il, const Dsv4AttnOpts& o) {
    const Dsv4AttnOpts::Layout at = o.layout(n_ctx_);
    float *st = cache(slot, il).state, *kvs = cache(slot, il).kv_state;
    Dsv4Layout l;
    l.ring = kvs;
    if (o.ratio > 0) l.comp_st = st + at.comp_state, l.entries = kvs + at.comp_entries;
    if (o.ratio == 4) l.idx_st = st + at.idx_state, l.idx_entries = kvs + at.idx_entries;
    return l;
  }
  void dsv4_compress_at(int slot, int il, const Dsv4AttnOpts& o, const Dsv4CompressIn& in,
                        int64_t pos0) override {
    if (!ok() || o.ratio == 0) return;
    const Dsv4Layout l = dsv4_layout(slot, il, o);
    auto compress = [&](Act kv, Act score, const Tensor& ape, const Tensor& norm, float* st,
                        float* entries, int64_t width, int64_t dim) {
      kernels::cuda::Dsv4Compress c;
      c.kv = kv.data, c.score = score.data, c.ape = dev_f32(ape), c.norm = dev_f32(norm);
      const int64_t slots = o.pending();
      c.pend_kv = st, c.pend_score = st + slots * width, c.entries = entries;
      c.n_tokens = kv.rows, c.pos0 = pos0, c.ratio = o.ratio, c.slots = slots, c.width = width,
      c.dim = dim, c.n_rot = o.n_rot, c.eps = o.eps, c.rope_base = o.rope.base;
      if (o.rope.yarn) c.use_yarn = true, c.yarn = *o.rope.yarn;
      if (ok()) check("dsv4_compress", kernels::cuda::dsv4_compress(c, stream_));
    };
    compress(in.comp_kv, in.comp_score, o.ape, o.norm, l.comp_st, l.entries, o.coff() * o.head_dim,
             o.head_dim);
    if (o.ratio == 4)
      compress(in.idx_kv, in.idx_score, o.idx_ape, o.idx_norm, l.idx_st, l.idx_entries,
               2 * o.idx_dim, o.idx_dim);
  }
  void dsv4_index_at(int slot, int il, const Dsv4AttnOpts& o, Act q, Act w, int64_t pos0,
                     Act scores) override {
    if (ok())
      check("dsv4_index",
            kernels::cuda::dsv4_index_scores(q.data, w.data, dsv4_layout(slot, il, o).idx_entries,
                                             scores.data, q.rows, pos0, o.ratio, o.idx_heads,
                                             o.idx_dim, scores.cols, o.idx_scale, stream_));
  }
  void hadamard(Act x, int64_t n) override {
    if (x.cols % n)
      return fail(make_error("hadamard: rows of " + std::to_string(x.cols) +
                             " values are not blocks of " + std::to_string(n)));
    if (ok()) check("hadamard", kernels::cuda::hadamard(x.data, x.rows * x.cols / n, n, stream_));
  }
  void index_scores_at(int slot, int il, const IndexOpts& o, Act q, Act k, Act w, int64_t pos0,
                       Act scores) override {
    if (!ok()) return;
    float* keys = cache(slot, il).v;
    check("cache index keys",
          cudaMemcpyAsync(keys + pos0 * o.dim, k.data, sizeof(float) * k.rows * o.dim,
                          cudaMemcpyDeviceToDevice, stream_));
    if (ok())
      check("index_scores",
            kernels::cuda::dsv4_index_scores(q.data, w.data, keys, scores.data, q.rows, pos0, 1,
                                             o.heads, o.dim, scores.cols, o.scale, stream_));
  }
  void block_scores_at(int slot, int il, const BlockIndexOpts& o, Act q, Act k, int64_t pos0,
                       Act scores) override {
    if (!ok()) return;
    Cache& c = cache(slot, il);
    const int64_t off = c.rows.k - o.dim;
    const size_t f = sizeof(float);
    check("cache index keys",
          cudaMemcpy2DAsync(c.k + pos0 * c.rows.k + off, c.rows.k * f, k.data, o.dim * f, o.dim * f,
                            size_t(k.rows), cudaMemcpyDeviceToDevice, stream_));
    kernels::cuda::BlockScores a;
    a.q = q.data, a.keys = c.k + off, a.scores = scores.data, a.n_tokens = q.rows, a.pos0 = pos0,
    a.heads = o.heads, a.dim = o.dim, a.key_row = c.rows.k, a.block = o.block, a.local = o.local,
    a.n_blocks = scores.cols / o.heads;
    if (ok()) check("block_scores", kernels::cuda::msa_block_scores(a, stream_));
  }
  // The top-k on the host with the CPU's definition (ties as ggml's CPU breaks them), as the
  // routing of the gating variants is: the values there, the ids back.
  void top_k(Act x, int k, Act ids) override {
    std::vector<float> host(size_t(x.rows * x.cols));
    to_host(x, host.data());
    if (!ok()) return;
    std::vector<int32_t> out(size_t(x.rows) * k);
    for (int64_t t = 0; t < x.rows; ++t)
      top_k_row(&host[size_t(t * x.cols)], x.cols, k, &out[size_t(t) * k]);
    check("upload top_k", cudaMemcpyAsync(ids.data, out.data(), out.size() * sizeof(int32_t),
                                          cudaMemcpyHostToDevice, stream_));
  }
  void attention_dsv4_at(int slot, int il, const Dsv4AttnOpts& o, Act q, Act kv, Act sel,
                         int64_t pos0, Act out) override {
    if (!ok()) return;
    const int64_t T = q.rows, D = o.head_dim, W = o.window, r = o.ratio;
    const Dsv4Layout l = dsv4_layout(slot, il, o);
    // Each token's entries, ascending: its ids of sel, or every visible one.
    const int64_t stride = std::max<int64_t>(1, sel.data ? sel.cols : r > 0 ? (pos0 + T) / r : 0);
    Act dsel = alloc(T, stride + 1);  // int32s: the lists, then the counts
    if (!ok()) return;
    int32_t* ids = dsel.i32();
    check("dsv4_select", kernels::cuda::dsv4_select(sel.data ? sel.i32() : nullptr, T, pos0, r, ids,
                                                    ids + T * stride, stride, stream_));
    kernels::cuda::Dsv4Attention a;
    a.q = q.data, a.kv = kv.data, a.ring = l.ring, a.entries = l.entries,
    a.sinks = o.sinks ? dev_f32(o.sinks) : nullptr, a.sel = ids, a.sel_n = ids + T * stride,
    a.out = out.data, a.n_tokens = T, a.pos0 = pos0, a.n_head = o.n_head, a.dim = D, a.window = W,
    a.sel_stride = stride, a.scale = o.scale;
    if (ok()) check("dsv4_attention", kernels::cuda::dsv4_attention(a, stream_));
    if (ok())
      check("dsv4_ring", kernels::cuda::dsv4_ring_store(kv.data, l.ring, T, pos0, W, D, stream_));
  }

  // Routing on the device (the softmax/top-k kernel for plain softmax gating, route_select for
  // the rest, the CPU's steps), its ids and weights into ids_w: T x k ids, then T x k weights.
  // Hash routing (forced) stays the host's. False where the kernels do not take this layer.
  bool route_on_device(Act logits, const MoeWeights& w, int k, const int32_t* forced, Act ids_w) {
    const RouteOpts& o = w.route;
    const int64_t T = logits.rows, n = T * k;
    if (forced || k > 32 || (o.n_group > 1 && (o.n_group > 64 || logits.cols % o.n_group)))
      return false;
    if (!ok()) return true;
    if (!(o.sigmoid || o.sqrt_softplus || o.n_group > 1 || o.w_scale != 1.0f ||
          o.topk_then_softmax || w.exp_probs_b)) {
      check("softmax_topk", kernels::cuda::softmax_topk(logits.data, T, logits.cols, k, o.norm_topk,
                                                        ids_w.i32(), ids_w.data + n, stream_));
      return true;
    }
    kernels::cuda::RouteSelect r;
    r.p = logits.data, r.bias = w.exp_probs_b ? dev_f32(w.exp_probs_b) : nullptr;
    r.ids = ids_w.i32(), r.weights = ids_w.data + n, r.n_tokens = T, r.n_expert = logits.cols;
    r.k = k, r.n_group = o.n_group, r.n_group_used = o.n_group_used, r.sigmoid = o.sigmoid;
    r.sqrt_softplus = o.sqrt_softplus, r.topk_then_softmax = o.topk_then_softmax;
    r.norm_topk = o.norm_topk, r.w_scale = o.w_scale;
    if (ok()) check("route_select", kernels::cuda::route_select(r, stream_));
    return true;
  }

  // The routes come down in one download (one wait).
  void route(Act logits, const MoeWeights& w, int k, const int32_t* forced,
             std::vector<Route>& out) override {
    const int64_t T = logits.rows, n = T * k;
    Act both = alloc(T, 2 * k);
    if (!route_on_device(logits, w, k, forced, both)) return Ops::route(logits, w, k, forced, out);
    std::vector<float> host(size_t(2 * n));
    to_host(both, host.data());
    if (!ok()) return;
    const auto* ids = reinterpret_cast<const int32_t*>(host.data());
    out.resize(T);
    for (int64_t t = 0; t < T; ++t) {
      out[t].experts.assign(ids + t * k, ids + (t + 1) * k);
      out[t].weights.assign(&host[size_t(n + t * k)], &host[size_t(n + (t + 1) * k)]);
    }
  }

  // With the experts uploaded (--local), a layer of a few tokens (decode) never leaves the
  // device: the routing kernels' ids pick each (token, k) slot's expert matrices in matmul_id
  // (the same sums as the grouped path's matmul: the same bits) and biases, then the activation
  // and the weighted sum in router order. A prefill keeps the grouped path, which reads each
  // expert's weights once for all its tokens.
  static constexpr int64_t kResidentSlots = 16;
  bool moe_resident(Act logits, const MoeWeights& w, int k, Act h, Act out) override {
    const int64_t T = logits.rows, S = T * k;
    if (!experts_placed_ || S > kResidentSlots || !ok()) return false;
    Act both = alloc(T, 2 * k);
    if (!route_on_device(logits, w, k, nullptr, both)) return false;
    const Tensor &gate = w.gate_exps, &up = w.up_exps, &down = w.down_exps;
    const int64_t E = h.cols, F = gate.ne[1];
    Act g = alloc(S, F), u = alloc(S, F), ys = alloc(S, E);
    const uint8_t *dg = dev(gate), *du = dev(up), *dd = dev(down);
    if (!ok()) return true;  // the failure is recorded: the eval ends after the block
    const int32_t* ids = both.i32();
    auto mm = [&](const Tensor& t, const uint8_t* d, int64_t rows, int64_t cols, const float* x,
                  int64_t x_div, float* y, const Tensor& b) {
      if (ok())
        check("matmul_id", kernels::cuda::matmul_id(t.type, d, t.matrix_bytes(), rows, cols, ids, S,
                                                    x, x_div, y, stream_));
      if (b && ok())
        check("add_rows_id", kernels::cuda::add_rows_id(y, dev_f32(b), ids, rows, S, stream_));
    };
    mm(gate, dg, F, E, h.data, k, g.data, w.gate_exps_b);
    mm(up, du, F, E, h.data, k, u.data, w.up_exps_b);
    glu(w.act, g, u);
    mm(down, dd, E, F, g.data, 1, ys.data, w.down_exps_b);
    if (ok())
      check("weighted_sum",
            kernels::cuda::weighted_sum(ys.data, both.data + S, out.data, T, k, E, stream_));
    return true;
  }

  // n int32s of pinned staging for an upload, once the last upload from it has been read.
  int32_t* staging(size_t n) {
    if (!ok()) return nullptr;
    if (!staged_read_)
      check("cudaEventCreate", cudaEventCreateWithFlags(&staged_read_, cudaEventDisableTiming));
    else
      check("cudaEventSynchronize", cudaEventSynchronize(staged_read_));
    if (ok() && n > staged_cap_) {
      if (staged_) cudaFreeHost(staged_), staged_ = nullptr, staged_cap_ = 0;
      const size_t cap = std::max<size_t>(n, 4096);
      void* p = nullptr;
      check("cudaHostAlloc", cudaHostAlloc(&p, cap * sizeof(int32_t), cudaHostAllocPortable));
      if (ok()) staged_ = static_cast<int32_t*>(p), staged_cap_ = cap;
    }
    return staged_;
  }

  // Per expert: its tokens' rows gathered, gate/up, the activation, down, scattered to their
  // (token, k) rows; moe_end sums them in router order. The routes go up in one copy from pinned
  // memory — per expert its tokens then its output rows, then the mixing weights — so the host
  // does not wait for the stream.
  void moe_begin(Act h, const MoeRoutes& r) override {
    moe_h_ = h, moe_r_ = &r;
    moe_at_.clear();
    size_t n_idx = 0;
    for (size_t i = 0; i < r.experts.size(); ++i)
      moe_at_.push_back(n_idx), n_idx += r.tokens[i].size() + r.outs[i].size();
    const size_t n = n_idx + r.weights.size();
    Act up = alloc(1, std::max<int64_t>(int64_t(n), 1));
    moe_out_ = alloc(int64_t{r.n_tokens} * r.k, h.cols);
    int32_t* host = staging(n);
    if (!ok()) return;
    for (size_t i = 0; i < r.experts.size(); ++i) {
      int32_t* p = host + moe_at_[i];
      p = std::copy(r.tokens[i].begin(), r.tokens[i].end(), p);
      std::copy(r.outs[i].begin(), r.outs[i].end(), p);
    }
    std::memcpy(host + n_idx, r.weights.data(), r.weights.size() * sizeof(float));
    moe_idx_ = up.i32(), moe_w_ = Act{up.data + n_idx, r.n_tokens, r.k};
    check("upload routes",
          cudaMemcpyAsync(up.data, host, n * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
    if (ok()) check("cudaEventRecord", cudaEventRecord(staged_read_, stream_));
  }

  void moe_experts(const MoeWeights& w, std::span<const size_t> idx,
                   std::span<const ExpertWeights> ws) override {
    for (size_t b = 0; b < idx.size() && ok(); ++b) {
      const size_t mark = arena_.mark();
      run_expert(w, ws[b], moe_idx_ + moe_at_[idx[b]],
                 static_cast<int64_t>(moe_r_->tokens[idx[b]].size()));
      arena_.release_to(
          mark);  // the stream orders the next expert's use of this memory after this one's
    }
  }

  void moe_end(Act out) override {
    if (ok())
      check("weighted_sum", kernels::cuda::weighted_sum(moe_out_.data, moe_w_.data, out.data,
                                                        out.rows, moe_r_->k, out.cols, stream_));
  }

 private:
  struct Cache {
    KvRows rows;
    float *k = nullptr, *v = nullptr, *state = nullptr, *kv_state = nullptr;
  };

  void run_expert(const MoeWeights& w, const ExpertWeights& ew, const int32_t* d_idx, int64_t n) {
    const int64_t E = moe_h_.cols, F = ew.gate.ne[1];
    Act xs = alloc(n, E), g = alloc(n, F), u = alloc(n, F), ys = alloc(n, E);
    if (!ok()) return;
    check("gather", kernels::cuda::gather_rows(moe_h_.data, d_idx, xs.data, n, E, stream_));
    matmul(ew.gate, xs, g);
    matmul(ew.up, xs, u);
    if (ew.gate_b) add_bias(g, ew.gate_b), add_bias(u, ew.up_b);
    if (!ok()) return;
    glu(w.act, g, u);
    matmul(ew.down, g, ys);
    if (ew.down_b) add_bias(ys, ew.down_b);
    if (ok())
      check("scatter",
            kernels::cuda::scatter_rows(ys.data, d_idx + n, moe_out_.data, n, E, stream_));
  }

  void glu(const Glu& a, Act g, Act u) {  // g = act(g, u)
    if (!ok()) return;
    const int64_t n = g.rows * g.cols;
    switch (a.kind) {
      case Activation::SwigluOai:
        return check("swiglu", kernels::cuda::swiglu_oai(g.data, u.data, g.data, n, stream_));
      case Activation::Situ:
        return check(
            "situ", kernels::cuda::situ(g.data, u.data, g.data, n, a.beta, a.linear_beta, stream_));
      case Activation::SwigluLimit:
      case Activation::SwigluClamp:
        return check("swiglu_limit",
                     kernels::cuda::swiglu_limit(g.data, u.data, g.data, n, a.limit,
                                                 a.kind == Activation::SwigluClamp, stream_));
      case Activation::Swiglu:
        break;
    }
    check("swiglu", kernels::cuda::swiglu(g.data, u.data, g.data, n, stream_));
  }

  const float* dev_f32(const Tensor& t) { return reinterpret_cast<const float*>(dev(t)); }

  // The device address of a tensor: a slot's (already on the device) or the placed copy of its
  // host bytes (a view into an uploaded tensor: an expert, a head).
  const uint8_t* dev(const Tensor& t) {
    if (!ok() || !t) return nullptr;
    if (t.on_device) return t.data;
    if (t.weight >= 0) {  // a model weight, or a view into one
      if (size_t(t.weight) < by_weight_.size()) {
        const Copy& c = by_weight_[size_t(t.weight)];
        if (c.dev && t.data >= c.host && t.data + t.bytes() <= c.host + c.bytes)
          return c.dev + (t.data - c.host);
      }
    } else if (auto it = placed_.upper_bound(t.data); it != placed_.begin()) {  // not numbered
      const Copy& c = (--it)->second;
      if (t.data + t.bytes() <= c.host + c.bytes) return c.dev + (t.data - c.host);
    }
    fail(make_error("a weight of type " + std::to_string(t.type) + " was not uploaded to the GPU"));
    return nullptr;
  }

  bool check_dv(int64_t dv) {
    if (dv <= kernels::cuda::kMaxAttentionDv) return true;
    fail(make_error("attention values of " + std::to_string(dv) +
                    " floats: the GPU attention kernel takes at most " +
                    std::to_string(kernels::cuda::kMaxAttentionDv)));
    return false;
  }

  void* device_buffer(size_t bytes) {
    void* p = nullptr;
    if (auto e = cudaMalloc(&p, std::max<size_t>(bytes, 1)); e != cudaSuccess) {
      fail(make_error(cuda_error("cudaMalloc", e)));
      return nullptr;
    }
    allocs_.push_back(p);
    return p;
  }
  float* device_alloc(size_t floats) {
    void* p = nullptr;
    return cudaMalloc(&p, floats * sizeof(float)) == cudaSuccess ? static_cast<float*>(p) : nullptr;
  }

  void check(const char* what, cudaError_t e) {
    if (e != cudaSuccess) fail(make_error(cuda_error(what, e)));
  }
  int n_ctx_ = 0, n_layer_ = 0;
  bool ok() const { return static_cast<bool>(status_); }
  void fail(const expertd::Error& e) {
    if (ok()) status_ = e;
  }

  std::string name_;
  cudaStream_t stream_ = nullptr;
  Status status_;
  std::vector<void*> allocs_;
  struct Copy {  // a tensor's bytes on the host and their copy in VRAM
    const uint8_t* host = nullptr;
    size_t bytes = 0;
    const uint8_t* dev = nullptr;  // null: not uploaded (an I32 table, an unplaced expert)
  };
  std::map<const uint8_t*, Copy> placed_;  // host address -> its copy
  std::vector<Copy> by_weight_;            // Tensor::weight -> its copy: no search per op
  BlockArena arena_;
  Cache& cache(int slot, int il) { return cache_[size_t(slot) * n_layer_ + il]; }
  std::vector<Cache> cache_;  // [slot][layer]
  Act moe_h_, moe_w_, moe_out_;
  const MoeRoutes* moe_r_ = nullptr;
  bool experts_placed_ = false;  // the routed experts were uploaded with the model (--local)
  // Pinned host memory of moe_begin's upload, reused once the event says the last one has read it.
  int32_t* staged_ = nullptr;
  size_t staged_cap_ = 0;
  cudaEvent_t staged_read_ = nullptr;
  int32_t* moe_idx_ = nullptr;
  std::vector<size_t> moe_at_;
};

// A cuda expertd's slots: device addresses; the stream waits on a slot's event before reading
// it (no host blocking on the hit path) and finishes before a lease is released.
class CudaSlotMemory final : public SlotMemory {
 public:
  CudaSlotMemory(std::unique_ptr<expertd::client::CudaSlots> s, cudaStream_t stream)
      : s_(std::move(s)), stream_(stream) {}
  const uint8_t* slot(const expertd::client::Lease& l, size_t i) override {
    return s_->slot_ptr(l.slots[i]);
  }
  bool on_device() const override { return true; }
  Status ready(uint32_t slot) override { return s_->wait(stream_, slot); }
  Status finish() override {
    if (auto e = cudaStreamSynchronize(stream_); e != cudaSuccess)
      return make_error(cuda_error("cudaStreamSynchronize", e));
    return {};
  }
  Status reopen(const expertd::client::ModelInfo& info) override {
    s_.reset();  // the old daemon's arena is gone
    auto s = expertd::client::CudaSlots::open(info);
    if (!s) return s.error();
    s_ = std::move(*s);
    return {};
  }

 private:
  std::unique_ptr<expertd::client::CudaSlots> s_;
  cudaStream_t stream_;
};

}  // namespace

expertd::Result<std::unique_ptr<Ops>> make_cuda_ops(const Model& m) {
  auto ops = std::make_unique<CudaOps>();
  if (auto st = ops->init(); !st) return st.error();
  if (auto st = ops->place(m, true); !st) return st.error();
  return std::unique_ptr<Ops>(std::move(ops));
}

expertd::Result<std::unique_ptr<Engine>> make_cuda_forward(const Model& m,
                                                           const std::string& socket, int n_ctx,
                                                           int reconnect_ms, int n_seq, KvType kv) {
  auto fail = [](const expertd::Error& e) { return make_error("--device cuda: " + e.message); };
  std::unique_ptr<expertd::client::Client> client;
  std::unique_ptr<expertd::client::CudaSlots> slots;
  if (!socket.empty()) {  // the daemon's GPU (CudaSlots::open selects it) is where everything below
                          // lives
    auto c = connect_daemon(m, socket, "cuda");
    if (!c) return fail(c.error());
    auto s = expertd::client::CudaSlots::open((*c)->info());
    if (!s) return fail(s.error());
    client = std::move(*c), slots = std::move(*s);
  }
  auto ops = std::make_unique<CudaOps>();
  if (auto st = ops->init(); !st) return fail(st.error());
  if (auto st = ops->place(m, socket.empty()); !st) return fail(st.error());
  const cudaStream_t stream = ops->stream();
  std::unique_ptr<ExpertSource> source =
      client ? make_daemon_source(m, std::move(client),
                                  std::make_unique<CudaSlotMemory>(std::move(slots), stream),
                                  {socket, "cuda", reconnect_ms})
             : make_local_source(m);
  auto e = std::make_unique<Engine>(m, std::move(ops), std::move(source), n_ctx, n_seq, kv);
  if (auto st = e->ops().status(); !st) return fail(st.error());
  return e;
}

}  // namespace engine
