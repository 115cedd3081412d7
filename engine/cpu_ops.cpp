#include "engine/cpu_ops.h"

#include <algorithm>
#include <array>
#include <cassert>
#include <cmath>
#include <cstring>
#include <memory>

#include "common/aligned.h"
#include "engine/activation.h"
#include "engine/arena.h"
#include "engine/delta_rule.h"
#include "engine/dsv4_cpu.h"
#include "engine/interleaved.h"

namespace engine {
namespace {

using dsv4::compress;
using dsv4::hc_weights;
using dsv4::narrow;
using dsv4::Pool;
using dsv4::row_of;
using dsv4::widen;

class CpuOps final : public Ops {
 public:
  explicit CpuOps(int n_threads) : pool_(n_threads), be_(kernels::best_isa()) {}

  std::string name() const override { return kernels::isa_name(be_); }
  expertd::Status status() const override { return {}; }  // nothing on the CPU fails
  uint64_t weight_copy_bytes() const override { return rows8_.bytes(); }

  Act alloc(int64_t rows, int64_t cols) override {
    return {arena_.alloc(size_t(rows * cols)), rows, cols};
  }
  size_t mark() const override { return arena_.mark(); }
  void release_to(size_t mark) override { arena_.release_to(mark); }
  void consolidate() override { arena_.consolidate(); }

  void init_cache(const std::vector<KvRows>& layers, int n_ctx, int n_slots, KvType type) override {
    n_ctx_ = n_ctx, n_layer_ = int(layers.size()), f16_ = type == KvType::F16;
    cache_.resize(layers.size() * size_t(n_slots));
    for (size_t i = 0; i < cache_.size(); ++i) {  // slot-major
      const KvRows& rows = layers[i % layers.size()];
      Cache& c = cache_[i];
      c.rows = rows;
      c.f16 = f16_;
      (f16_ ? c.k16.assign(size_t(n_ctx) * rows.k, 0) : c.k.assign(size_t(n_ctx) * rows.k, 0.0f));
      (f16_ ? c.v16.assign(size_t(n_ctx) * rows.v, 0) : c.v.assign(size_t(n_ctx) * rows.v, 0.0f));
      (f16_ ? c.kvs16.assign(size_t(rows.kv_state), 0) : c.kvs.assign(size_t(rows.kv_state), 0.0f));
      c.state.assign(size_t(rows.state), 0.0f);
    }
  }

  bool save_slot(int slot, int64_t n, std::vector<uint8_t>& out, int first_layer = 0) override {
    out.clear();
    auto put = [&](const auto& v, size_t count) {
      const auto* b = reinterpret_cast<const uint8_t*>(v.data());
      out.insert(out.end(), b, b + count * sizeof(v[0]));
    };
    for (int il = first_layer; il < n_layer_; ++il) {
      const Cache& c = cache(slot, il);
      if (f16_)
        put(c.k16, n * c.rows.k), put(c.v16, n * c.rows.v), put(c.kvs16, c.kvs16.size());
      else
        put(c.k, n * c.rows.k), put(c.v, n * c.rows.v), put(c.kvs, c.kvs.size());
      put(c.state, c.state.size());
    }
    return true;
  }

  bool load_slot(int slot, int64_t n_saved, int64_t n, std::span<const uint8_t> in,
                 int first_layer = 0) override {
    size_t at = 0;
    // `count` values of the copy into v, then skip past `saved` of them
    auto get = [&](auto& v, size_t count, size_t saved) {
      const size_t e = sizeof(v[0]);
      if (at + saved * e > in.size()) return false;
      if (count) std::memcpy(v.data(), in.data() + at, count * e);  // an empty part has no data()
      at += saved * e;
      return true;
    };
    for (int il = first_layer; il < n_layer_; ++il) {
      Cache& c = cache(slot, il);
      const size_t k = size_t(c.rows.k), v = size_t(c.rows.v), kvs = size_t(c.rows.kv_state);
      const bool ok = f16_ ? get(c.k16, n * k, n_saved * k) && get(c.v16, n * v, n_saved * v) &&
                                 get(c.kvs16, kvs, kvs)
                           : get(c.k, n * k, n_saved * k) && get(c.v, n * v, n_saved * v) &&
                                 get(c.kvs, kvs, kvs);
      if (!ok || !get(c.state, c.state.size(), c.state.size())) return false;
    }
    return at == in.size();
  }

  void embed(const Tensor& emb, std::span<const int32_t> tokens, Act x) override {
    for (size_t t = 0; t < tokens.size(); ++t)
      kernels::dequantize_row(emb.type, emb.data + emb.row_bytes() * tokens[t], x.row(t), x.cols);
  }

  void to_host(Act x, float* dst) override {
    std::memcpy(dst, x.data, sizeof(float) * x.rows * x.cols);
  }
  void from_host(const float* src, Act x) override {
    std::memcpy(x.data, src, sizeof(float) * x.rows * x.cols);
  }

  // A column view is gathered into whole rows first (and the product scattered into one).
  void matmul(const Tensor& w, Cols x, Cols y) override {
    assert(!w.on_device && x.n == w.ne[0] && y.n == w.ne[1] && x.rows() == y.rows());
    const size_t mark = arena_.mark();
    Act xs = x.whole() ? x.a : alloc(x.rows(), x.n), ys = y.whole() ? y.a : alloc(y.rows(), y.n);
    if (!x.whole()) copy(xs, x);
    kernels::matmul(w.type, w.data, w.ne[1], w.ne[0], xs.data, xs.rows, ys.data, scratch_, &pool_,
                    be_, rows8_.find(w));
    if (!y.whole()) copy(y, ys);
    arena_.release_to(mark);
  }

  void interleave(const Model& m, bool experts) { rows8_.build(m, experts, &pool_); }

  void add_bias(Act y, const Tensor& b) override {
    for (int64_t t = 0; t < y.rows; ++t)
      for (int64_t i = 0; i < y.cols; ++i) y.row(t)[i] += b.f32()[i];
  }

  void add(Act y, Act x) override {
    for (int64_t i = 0; i < y.rows * y.cols; ++i) y.data[i] += x.data[i];
  }

  void rms_norm(Cols x, const Tensor& w, Cols y, float eps, int64_t n) override {
    if (n == 0) n = x.n;
    for (int64_t t = 0; t < x.rows(); ++t)
      for (int64_t g = 0; g < x.n; g += n)
        kernels::rms_norm(x.row(t) + g, w.f32(), y.row(t) + g, n, eps);
  }

  void layer_norm(Act x, const Tensor& w, const Tensor& b, Act y, float eps) override {
    const int64_t n = x.cols;
    for (int64_t t = 0; t < x.rows; ++t) {
      const float* xr = x.row(t);
      float* yr = y.row(t);
      double sum = 0, sum2 = 0;  // ggml's sums in double
      for (int64_t i = 0; i < n; ++i) sum += double(xr[i]);
      const float mean = float(sum / double(n));
      for (int64_t i = 0; i < n; ++i) sum2 += double((xr[i] - mean) * (xr[i] - mean));
      const float scale = 1.0f / std::sqrt(float(sum2 / double(n)) + eps);
      for (int64_t i = 0; i < n; ++i) {
        float v = (xr[i] - mean) * scale;
        if (w) v *= w.f32()[i];
        if (b) v += b.f32()[i];
        yr[i] = v;
      }
    }
  }

  void rope_at(Act x, int64_t stride, int64_t offset, int64_t n_rot, int64_t pos0,
               const RopeOpts& o) override {
    for (int64_t t = 0; t < x.rows; ++t)
      for (int64_t h = 0; h < x.cols / stride; ++h)
        kernels::rope(x.row(t) + h * stride + offset, n_rot, n_rot, pos0 + t, o.base, o.neox,
                      o.yarn, o.inverse, o.freq_factors ? o.freq_factors.f32() : nullptr);
  }

  void scale_rows(Act x, std::span<const float> f) override {
    for (int64_t t = 0; t < x.rows; ++t)
      for (int64_t i = 0; i < x.cols; ++i) x.row(t)[i] *= f[size_t(t)];
  }

  void attn_temperature_at(Act x, int64_t pos0, const AttnTemp& t) override {
    for (int64_t r = 0; r < x.rows; ++r) {
      const float f = attn_temperature_factor(t, pos0 + r);
      for (int64_t i = 0; i < x.cols; ++i) x.row(r)[i] *= f;
    }
  }

  void attention_at(int slot, int il, Act q, Act k, Act v, int64_t pos0, const AttnOpts& o,
                    Act out) override {
    const int64_t D = o.head_dim, DV = o.dv(), KV = o.n_head_kv * D, VV = o.n_head_kv * DV,
                  H = o.n_head, T = q.rows;
    Cache& c = cache(slot, il);
    const int64_t KR = c.rows.k;  // the keys, then an indexer's key where the layer has one
    assert(KR >= KV && c.rows.v == VV && k.cols == KV && v.cols == VV);
    for (int64_t t = 0; t < T; ++t)
      c.store_k(pos0 + t, k.row(t), KV), c.store_v(pos0 + t, v.row(t));
    const int64_t group = H / o.n_head_kv;
    const int64_t per_kv =
        o.blocks.data ? o.blocks.cols / o.n_head_kv : 0;  // block ids per KV head
    // A job: one token's query heads that share a KV head, so that each key and value row is
    // read once for all of them (attend_group); halved while there are fewer jobs than threads.
    // Jobs in order of head, then of token from the last: a thread's run of jobs reads one head's
    // keys and values (the cache of one core holds them where it would not hold every head's),
    // and the longest jobs (the latest tokens see the most keys) are handed out first.
    int64_t G = group;
    while (G % 2 == 0 && T * (H / G) < 2 * int64_t(pool_.size())) G /= 2;
    const int64_t per_t = H / G;
    pool_.parallel_for(T * per_t, 1, [&](int64_t b, int64_t e) {
      std::vector<float> s, ks, vs;
      std::vector<uint16_t> ks16, vs16;
      std::vector<int32_t> ids;
      for (int64_t job = b; job < e; ++job) {
        const int64_t t = T - 1 - job % T, h0 = (job / T) * G, kvh = h0 / group;
        const int64_t n_keys = pos0 + t + 1;  // causal
        // Sliding window: key j is visible iff pos - j < window; a chunk: iff j is in pos's.
        int64_t first = o.window > 0 ? std::max<int64_t>(0, n_keys - o.window) : 0;
        if (o.chunk > 0) first = std::max(first, (n_keys - 1) / o.chunk * o.chunk);
        const float* sinks = o.sinks ? o.sinks.f32() + h0 : nullptr;
        const float* qh = q.row(t) + h0 * D;
        float* oh = out.row(t) + h0 * DV;
        if (per_kv) {  // block-sparse: the KV head's rows of its selected blocks, gathered
          ids.assign(o.blocks.i32() + t * o.blocks.cols + kvh * per_kv,
                     o.blocks.i32() + t * o.blocks.cols + (kvh + 1) * per_kv);
          std::sort(ids.begin(), ids.end());
          int64_t n = 0;
          auto gather = [&](const auto& kc, const auto& vc, auto& kb, auto& vb) {
            kb.resize(size_t(per_kv * o.block * D)), vb.resize(size_t(per_kv * o.block * DV));
            for (const int32_t id : ids)
              for (int64_t p = std::max<int64_t>(first, int64_t{id} * o.block);
                   id >= 0 && p < std::min<int64_t>(n_keys, int64_t{id + 1} * o.block); ++p, ++n) {
                std::copy_n(&kc[size_t(p * KR + kvh * D)], D, &kb[size_t(n * D)]);
                std::copy_n(&vc[size_t(p * VV + kvh * DV)], DV, &vb[size_t(n * DV)]);
              }
          };
          f16_ ? gather(c.k16, c.v16, ks16, vs16) : gather(c.k, c.v, ks, vs);
          s.resize(size_t(G * n));
          if (f16_)
            kernels::attend_group_f16(qh, D, int(G), ks16.data(), vs16.data(), n, D, DV, D, DV,
                                      o.scale, sinks, s.data(), oh, DV, be_);
          else
            kernels::attend_group(qh, D, int(G), ks.data(), vs.data(), n, D, DV, D, DV, o.scale,
                                  sinks, s.data(), oh, DV, be_);
          continue;
        }
        const size_t kat = size_t(first * KR + kvh * D), vat = size_t(first * VV + kvh * DV);
        s.resize(size_t(G * (n_keys - first)));
        if (f16_)
          kernels::attend_group_f16(qh, D, int(G), &c.k16[kat], &c.v16[vat], n_keys - first, KR, VV,
                                    D, DV, o.scale, sinks, s.data(), oh, DV, be_);
        else
          kernels::attend_group(qh, D, int(G), &c.k[kat], &c.v[vat], n_keys - first, KR, VV, D, DV,
                                o.scale, sinks, s.data(), oh, DV, be_);
      }
    });
  }

  // Multi-head latent attention as llama.cpp computes it ("absorbed"): each head's query is taken
  // into the latent space with attn_k_b, attention runs over the cached latent rows, and attn_v_b
  // takes each head's result back out.
  void attention_mla_at(int slot, int il, Act q, Act kv, const Tensor& wk_b, const Tensor& wv_b,
                        int64_t pos0, const MlaOpts& o, Act out, Act sel) override {
    const int64_t T = q.rows, H = o.n_head, R = o.n_rot, C = o.kv_lora, KL = C + R,
                  nope = o.qk_nope, KM = nope + R;
    Cache& c = cache(slot, il);
    assert(c.rows.k == KL);
    for (int64_t t = 0; t < T; ++t) c.store_k(pos0 + t, kv.row(t));
    // Per head: q_abs = k_b[h] . q_nope (T x kv_lora), then the full query [q_abs, q_pe].
    Act qf = alloc(T, H * KL), xin = alloc(T, std::max(nope, C)),
        yout = alloc(T, std::max(C, o.v_mla));
    for (int64_t hh = 0; hh < H; ++hh) {
      Act x_nope{xin.data, T, nope}, y_abs{yout.data, T, C};
      for (int64_t t = 0; t < T; ++t) std::copy_n(q.row(t) + hh * KM, nope, x_nope.row(t));
      matmul(wk_b.matrix(hh), x_nope, y_abs);
      for (int64_t t = 0; t < T; ++t) {
        float* dst = qf.row(t) + hh * KL;
        std::copy_n(y_abs.row(t), C, dst);
        std::copy_n(q.row(t) + hh * KM + nope, R, dst + C);
      }
    }
    if (o.temp) attn_temperature_at(qf, pos0, o.temp);
    // Attention over the latent rows: keys are whole rows, values their first kv_lora floats,
    // shared by every head: a job is one token's heads in groups of up to 16 (attend_group: each
    // latent row read once per group), smaller while there are fewer jobs than threads. With a
    // selection, a token's selected rows are gathered in ascending order first.
    Act lat = alloc(T, H * C);
    int64_t G = std::min<int64_t>(H, 16);
    while (G > 1 && T * ((H + G - 1) / G) < 2 * int64_t(pool_.size())) G = (G + 1) / 2;
    const int64_t per_t = (H + G - 1) / G;
    pool_.parallel_for(T * per_t, 1, [&](int64_t b, int64_t e) {
      std::vector<float> s, keys;
      std::vector<uint16_t> keys16;
      std::vector<int32_t> ids;
      int64_t have = -1;  // the token whose selected rows keys/keys16 hold
      for (int64_t job = b; job < e; ++job) {
        const int64_t t = job / per_t, h0 = (job % per_t) * G, g = std::min(G, H - h0);
        int64_t n_keys = pos0 + t + 1;
        const float* k32 = c.k.data();
        const uint16_t* k16 = c.k16.data();
        if (sel.data) {
          if (have != t) {  // gathered once per token, not once per group of its heads
            have = t;
            ids.clear();
            for (int64_t j = 0; j < sel.cols; ++j)
              if (const int32_t id = sel.i32()[t * sel.cols + j]; id >= 0 && id < n_keys)
                ids.push_back(id);
            std::sort(ids.begin(), ids.end());
            const size_t n = ids.size();
            f16_ ? keys16.resize(n * KL) : keys.resize(n * KL);
            for (size_t j = 0; j < n; ++j)
              f16_ ? void(std::copy_n(&c.k16[size_t(ids[j] * KL)], KL, &keys16[j * KL]))
                   : void(std::copy_n(&c.k[size_t(ids[j] * KL)], KL, &keys[j * KL]));
          }
          n_keys = int64_t(ids.size());
          k32 = keys.data(), k16 = keys16.data();
        }
        s.resize(size_t(g * n_keys));
        if (f16_)
          kernels::attend_group_f16(qf.row(t) + h0 * KL, KL, int(g), k16, k16, n_keys, KL, KL, KL,
                                    C, o.scale, nullptr, s.data(), lat.row(t) + h0 * C, C, be_);
        else
          kernels::attend_group(qf.row(t) + h0 * KL, KL, int(g), k32, k32, n_keys, KL, KL, KL, C,
                                o.scale, nullptr, s.data(), lat.row(t) + h0 * C, C, be_);
      }
    });
    // Per head back out of the latent space: v_b[h] . lat (T x v_mla).
    for (int64_t hh = 0; hh < H; ++hh) {
      Act x_lat{xin.data, T, C}, y_v{yout.data, T, o.v_mla};
      for (int64_t t = 0; t < T; ++t) std::copy_n(lat.row(t) + hh * C, C, x_lat.row(t));
      matmul(wv_b.matrix(hh), x_lat, y_v);
      for (int64_t t = 0; t < T; ++t) std::copy_n(y_v.row(t), o.v_mla, out.row(t) + hh * o.v_mla);
    }
  }

  void ffn(const FfnWeights& w, Act h, Act out) override {
    const int64_t F = w.gate.ne[1];
    Act a = alloc(h.rows, F), b = alloc(h.rows, F);
    matmul(w.gate, h, a);
    matmul(w.up, h, b);
    glu_rows(w.act, a.data, b.data, h.rows * F, be_);
    matmul(w.down, a, out);
  }

  void copy(Cols dst, Cols src) override {
    if (dst.whole() && src.whole())
      return (void)std::memcpy(dst.a.data, src.a.data, sizeof(float) * src.rows() * src.n);
    for (int64_t t = 0; t < src.rows(); ++t) std::copy_n(src.row(t), src.n, dst.row(t));
  }

  void repeat(Act x, int n, Act out) override {
    for (int64_t t = 0; t < x.rows; ++t)
      for (int i = 0; i < n; ++i) std::copy_n(x.row(t), x.cols, out.row(t) + i * x.cols);
  }

  void mul_act(Act y, Act g, Unary f) override {
    const int64_t n = y.rows * y.cols, span = y.cols / g.cols;  // y[i] by g[i / span]
    assert(g.rows == y.rows && y.cols % g.cols == 0);
    for (int64_t i = 0; i < n; ++i) {
      const float x = g.data[i / span];
      y.data[i] *= f == Unary::Sigmoid ? sigmoid(x)
                   : f == Unary::Silu  ? kernels::silu(x)
                                       : (x > 20.0f ? x : std::log(1.0f + std::exp(x)));
    }
  }

  void res_mix(Act stack, int n, Act cur, const Tensor& w, float eps, Act out) override {
    const int64_t T = cur.rows, E = cur.cols;
    std::vector<float> p(n + 1), normed(E);
    auto score = [&](const float* x) {  // ggml's sum_rows adds in double
      kernels::rms_norm(x, w.f32(), normed.data(), E, eps);
      double s = 0;
      for (int64_t i = 0; i < E; ++i) s += normed[i];
      return static_cast<float>(s);
    };
    for (int64_t t = 0; t < T; ++t) {
      for (int j = 0; j < n; ++j) p[j] = score(stack.row(j * T + t));
      p[n] = score(cur.row(t));
      kernels::softmax(p.data(), n + 1);
      float* o = out.row(t);
      const float* c = cur.row(t);
      for (int64_t i = 0; i < E; ++i) {
        float sum = 0;
        for (int j = 0; j < n; ++j) sum += stack.row(j * T + t)[i] * p[j];
        o[i] = sum + c[i] * p[n];
      }
    }
  }

  void delta_rule_at(int slot, int il, const DeltaOpts& o, Act q, Act k, Act v, Act g, Act beta,
                     int64_t pos0, Act out) override {
    std::vector<float>& st = cache(slot, il).state;
    if (pos0 == 0) std::fill(st.begin(), st.end(), 0.0f);
    delta_rule_cpu(o, q, k, v, g, beta, st.data(), out, pool_, be_);
  }

  void add_gated(Act y, Act x, const Tensor& gate, Act h) override {
    const int64_t E = y.cols;
    for (int64_t t = 0; t < y.rows; ++t) {
      float g = 1.0f;
      if (gate) {
        float z = 0;
        for (int64_t i = 0; i < E; ++i) z += gate.f32()[i] * h.row(t)[i];
        g = 1.0f / (1.0f + std::exp(-z));
      }
      for (int64_t i = 0; i < E; ++i) y.row(t)[i] += g * x.row(t)[i];
    }
  }

  void hc_pre(Act x, Act mixes, const HcOpts& o, bool head, Act out, Act pc) override {
    const int hc = o.hc;
    const int64_t n = out.cols;
    const float *sc = o.scale.f32(), *b = o.base.f32();
    std::vector<float> pre(hc);
    for (int64_t t = 0; t < x.rows; ++t) {
      const float* m = mixes.data ? mixes.row(t) : nullptr;
      for (int h = 0; h < hc; ++h)
        pre[h] = mixes.data ? sigmoid(m[h] * sc[0] + b[h]) + o.eps : 1.0f / float(hc);
      if (!head) hc_weights(m, o, pc.row(t));
      const float* xs = x.row(t);
      float* y = out.row(t);
      for (int64_t i = 0; i < n; ++i) {  // ggml's dsv4_hc_pre: streams in order, float sum
        float sum = 0.0f;
        for (int h = 0; h < hc; ++h) sum += xs[h * n + i] * pre[h];
        y[i] = sum;
      }
    }
  }

  void hc_post(Act f, Act x, Act pc, int hc, Act out) override {
    const int64_t n = f.cols;
    for (int64_t t = 0; t < f.rows; ++t) {
      const float *post = pc.row(t), *comb = post + hc, *ft = f.row(t), *xs = x.row(t);
      float* y = out.row(t);
      for (int dst = 0; dst < hc; ++dst)
        for (int64_t i = 0; i < n; ++i) {
          float sum = ft[i] * post[dst];
          for (int src = 0; src < hc; ++src) sum += xs[src * n + i] * comb[dst + hc * src];
          y[dst * n + i] = sum;
        }
    }
  }

  // DeepSeek-V4: the compressors token by token (their pending rows are a ring of o.pending()
  // positions), the indexer's scores, then each token's keys: the window's rows (this eval's
  // from kv, older ones from the ring) and its compressed entries, attended per head with the
  // sink; last, the window ring takes this eval's newest rows. The ring and the entries are in
  // the cache's type E (widened as they are read, rounded as they are written), the pending rows
  // in F32.
  template <typename E>
  struct Dsv4Cache {
    E* ring = nullptr;
    Pool<E> comp, idx;
  };
  // f(Dsv4Cache<E>) on layer il's cache of slot `slot`, in the cache's type.
  template <typename F>
  void with_dsv4(int slot, int il, const Dsv4AttnOpts& o, F&& f) {
    Cache& c = cache(slot, il);
    auto layout = [&](auto* kvs) {
      float* st = c.state.data();
      const Dsv4AttnOpts::Layout l = o.layout(n_ctx_);
      const int64_t slots = o.pending(), cw = o.coff() * o.head_dim, iw = 2 * o.idx_dim;
      Dsv4Cache<std::remove_pointer_t<decltype(kvs)>> d;
      d.ring = kvs;
      if (o.ratio > 0)
        d.comp = {
            st + l.comp_state, st + l.comp_state + slots * cw, kvs + l.comp_entries, slots, cw,
            o.head_dim};
      if (o.ratio == 4)
        d.idx = {st + l.idx_state, st + l.idx_state + slots * iw, kvs + l.idx_entries, slots, iw,
                 o.idx_dim};
      f(d);
    };
    if (f16_)
      layout(c.kvs16.data());
    else
      layout(c.kvs.data());
  }
  void dsv4_compress_at(int slot, int il, const Dsv4AttnOpts& o, const Dsv4CompressIn& in,
                        int64_t pos0) override {
    if (o.ratio == 0) return;
    with_dsv4(slot, il, o, [&](auto d) {
      for (int64_t t = 0; t < in.comp_kv.rows; ++t) {
        const int64_t p = pos0 + t;
        compress(d.comp, o, o.ape, o.norm, in.comp_kv.row(t), in.comp_score.row(t), p);
        if (o.ratio == 4)
          compress(d.idx, o, o.idx_ape, o.idx_norm, in.idx_kv.row(t), in.idx_score.row(t), p);
      }
    });
  }
  void dsv4_index_at(int slot, int il, const Dsv4AttnOpts& o, Act q, Act w, int64_t pos0,
                     Act scores) override {
    with_dsv4(slot, il, o, [&](auto d) {
      pool_.parallel_for(q.rows, 1, [&](int64_t b, int64_t e) {
        std::vector<float> krow(size_t(o.idx_dim));
        for (int64_t t = b; t < e; ++t) {
          const int64_t n_vis = std::min((pos0 + t + 1) / o.ratio, scores.cols);
          const float *qt = q.row(t), *wt = w.row(t);
          float* sc = scores.row(t);
          for (int64_t j = 0; j < n_vis; ++j) {
            const float* k = row_of(d.idx.entries + j * o.idx_dim, krow.data(), o.idx_dim);
            sc[j] = index_score(qt, wt, k, o.idx_heads, o.idx_dim, o.idx_scale, be_);
          }
          std::fill(sc + n_vis, sc + scores.cols, -INFINITY);
        }
      });
    });
  }
  void hadamard(Act x, int64_t n) override {
    for (int64_t t = 0; t < x.rows; ++t)
      for (int64_t b = 0; b + n <= x.cols; b += n) hadamard_row(x.row(t) + b, n);
  }
  void index_scores_at(int slot, int il, const IndexOpts& o, Act q, Act k, Act w, int64_t pos0,
                       Act scores) override {
    Cache& c = cache(slot, il);
    assert(c.rows.v == o.dim);
    for (int64_t t = 0; t < k.rows; ++t) c.store_v(pos0 + t, k.row(t));
    pool_.parallel_for(q.rows, 1, [&](int64_t b, int64_t e) {
      std::vector<float> krow(size_t(o.dim));
      for (int64_t t = b; t < e; ++t) {
        const int64_t n_vis = std::min(pos0 + t + 1, scores.cols);
        float* sc = scores.row(t);
        for (int64_t p = 0; p < n_vis; ++p) {
          const float* kp = f16_ ? row_of(&c.v16[size_t(p * o.dim)], krow.data(), o.dim)
                                 : &c.v[size_t(p * o.dim)];
          sc[p] = index_score(q.row(t), w.row(t), kp, o.heads, o.dim, o.scale, be_);
        }
        std::fill(sc + n_vis, sc + scores.cols, -INFINITY);
      }
    });
  }
  void block_scores_at(int slot, int il, const BlockIndexOpts& o, Act q, Act k, int64_t pos0,
                       Act scores) override {
    Cache& c = cache(slot, il);
    const int64_t off = c.rows.k - o.dim, nblk = scores.cols / o.heads;
    assert(off >= 0 && k.cols == o.dim && q.cols == o.heads * o.dim);
    for (int64_t t = 0; t < k.rows; ++t) c.store_k(pos0 + t, k.row(t), o.dim, off);
    // Per (token, head): each visible position's score into its block's maximum, then the
    // forcing bias on the local blocks.
    pool_.parallel_for(q.rows * o.heads, 1, [&](int64_t b, int64_t e) {
      std::vector<float> krow(size_t(o.dim));
      for (int64_t job = b; job < e; ++job) {
        const int64_t t = job / o.heads, h = job % o.heads, pos = pos0 + t, L = pos / o.block;
        const float* qh = q.row(t) + h * o.dim;
        float* sc = scores.row(t) + h * nblk;
        std::fill(sc, sc + nblk, -INFINITY);
        for (int64_t p = 0; p <= pos; ++p) {
          const float* kp = f16_ ? row_of(&c.k16[size_t(p * c.rows.k + off)], krow.data(), o.dim)
                                 : &c.k[size_t(p * c.rows.k + off)];
          float& m = sc[p / o.block];
          m = std::max(m, kernels::dot_f32_ggml(qh, kp, o.dim, be_));
        }
        for (int64_t l = 0; l < o.local && L - l >= 0; ++l)
          if (L - l < nblk) sc[L - l] += 1e30f;
      }
    });
  }
  void top_k(Act x, int k, Act ids) override {
    pool_.parallel_for(x.rows, 1, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) top_k_row(x.row(t), x.cols, k, ids.i32() + t * ids.cols);
    });
  }
  void attention_dsv4_at(int slot, int il, const Dsv4AttnOpts& o, Act q, Act kv, Act sel,
                         int64_t pos0, Act out) override {
    with_dsv4(slot, il, o, [&](auto d) { dsv4_attend(d, o, q, kv, sel, pos0, out); });
  }
  template <typename E>
  void dsv4_attend(const Dsv4Cache<E>& d, const Dsv4AttnOpts& o, Act q, Act kv, Act sel,
                   int64_t pos0, Act out) {
    const int64_t T = q.rows, D = o.head_dim, H = o.n_head, W = o.window, r = o.ratio;
    // The compressed entries each token attends to, ascending.
    std::vector<std::vector<int32_t>> lists(T);
    for (int64_t t = 0; t < T && r > 0; ++t) {
      auto& s = lists[t];
      if (sel.data) {
        const int32_t* row = sel.i32() + t * sel.cols;
        for (int64_t j = 0; j < sel.cols; ++j)
          if (row[j] >= 0) s.push_back(row[j]);
        std::sort(s.begin(), s.end());
      } else {
        for (int64_t j = 0; j < (pos0 + t + 1) / r; ++j) s.push_back(static_cast<int32_t>(j));
      }
    }
    // A job: one token's heads in groups of up to 16 over the token's key list (attend_group:
    // the list read once per group, not once per head), smaller while jobs are fewer than threads.
    int64_t G = std::min<int64_t>(H, 16);
    while (G > 1 && T * ((H + G - 1) / G) < 2 * int64_t(pool_.size())) G = (G + 1) / 2;
    const int64_t per_t = (H + G - 1) / G;
    pool_.parallel_for(T * per_t, per_t, [&](int64_t b, int64_t e) {
      std::vector<float> keys, sc;
      int64_t have = -1, n_keys = 0;
      for (int64_t job = b; job < e; ++job) {
        const int64_t t = job / per_t, h0 = (job % per_t) * G, g = std::min(G, H - h0),
                      p = pos0 + t;
        if (have != t) {
          const int64_t first = std::max<int64_t>(0, p - W + 1);
          n_keys = p - first + 1 + static_cast<int64_t>(lists[t].size());
          keys.resize(size_t(n_keys) * D);
          float* k = keys.data();
          for (int64_t j = first; j <= p; ++j, k += D)
            if (j >= pos0)
              std::copy_n(kv.row(j - pos0), D, k);
            else
              widen(d.ring + (j % W) * D, k, D);
          for (int32_t j : lists[t]) widen(d.comp.entries + j * D, k, D), k += D;
          have = t;
        }
        sc.resize(size_t(g * n_keys));
        kernels::attend_group(q.row(t) + h0 * D, D, int(g), keys.data(), keys.data(), n_keys, D, D,
                              D, D, o.scale, o.sinks ? o.sinks.f32() + h0 : nullptr, sc.data(),
                              out.row(t) + h0 * D, D, be_);
      }
    });
    for (int64_t j = std::max(pos0, pos0 + T - W); j < pos0 + T; ++j)
      narrow(kv.row(j - pos0), d.ring + (j % W) * D, D);
  }

  void route(Act logits, const MoeWeights& w, int k, const int32_t* forced,
             std::vector<Route>& out) override {
    out.resize(logits.rows);
    for (int64_t t = 0; t < logits.rows; ++t)
      select_experts(w.route, w.exp_probs_b, static_cast<int>(logits.cols), k, logits.row(t),
                     out[t], forced ? forced + t * k : nullptr);
  }

  void moe_begin(Act h, const MoeRoutes& r) override {
    moe_.h = h, moe_.r = &r;
    for (auto& c : moe_.hq) c.type = ~0u;  // which activation types the buffers hold is per layer
    moe_.out.resize(size_t(r.n_tokens) * r.k *
                    h.cols);  // every (token, k) row is written by the experts
  }

  // An expert matrix's rows and interleaved copy for a matmul job: a slot of a pack built with
  // --layout rows8 holds only the interleaved layout (the kernels unpack it where they need rows).
  static const void* rows_of(const Tensor& t) { return t.rows8 ? nullptr : t.data; }
  const void* rows8_of(const Tensor& t) const { return t.rows8 ? t.data : rows8_.find(t); }

  // Each batch of available experts: gate and up of all of them in one parallel loop, the
  // activation, then all their down projections in another (two fork-joins per batch, not
  // three per expert). The inputs are quantized once per layer for each activation type.
  void moe_experts(const MoeWeights& w, std::span<const size_t> idx,
                   std::span<const ExpertWeights> ws) override {
    const MoeRoutes& r = *moe_.r;
    const int64_t E = moe_.h.cols;
    const size_t nb = idx.size();
    auto &g = moe_.g, &u = moe_.u, &ys = moe_.ys;
    auto& aq = moe_.aq;
    auto& jobs = moe_.jobs;
    g.resize(nb), u.resize(nb), ys.resize(nb), aq.resize(nb);
    jobs.clear();
    for (size_t b = 0; b < nb; ++b) {
      assert(!ws[b].gate.on_device);
      const auto& tk = r.tokens[idx[b]];
      const int64_t n = static_cast<int64_t>(tk.size()), F = ws[b].gate.ne[1];
      g[b].resize(n * F), u[b].resize(n * F);
      const auto& qg = quantized_h(ws[b].gate.type);
      const auto& qu = quantized_h(ws[b].up.type);
      jobs.push_back({ws[b].gate.type, rows_of(ws[b].gate), F, E, qg.buf.data(), qg.row, tk.data(),
                      n, g[b].data(), rows8_of(ws[b].gate)});
      jobs.push_back({ws[b].up.type, rows_of(ws[b].up), F, E, qu.buf.data(), qu.row, tk.data(), n,
                      u[b].data(), rows8_of(ws[b].up)});
    }
    kernels::matmul_batch(jobs.data(), jobs.size(), &pool_, be_);
    jobs.clear();
    for (size_t b = 0; b < nb; ++b) {
      const ExpertWeights& ew = ws[b];
      const int64_t n = static_cast<int64_t>(r.tokens[idx[b]].size()), F = ew.gate.ne[1];
      if (ew.gate_b)
        for (int64_t i = 0; i < n; ++i)
          for (int64_t j = 0; j < F; ++j)
            g[b][i * F + j] += ew.gate_b.f32()[j], u[b][i * F + j] += ew.up_b.f32()[j];
      glu_rows(w.act, g[b].data(), u[b].data(), int64_t(g[b].size()), be_);
      const size_t arow = kernels::row_size(kernels::vec_dot_type(ew.down.type), F);
      aq[b].resize(arow * n);
      for (int64_t i = 0; i < n; ++i)
        kernels::quantize_activations(ew.down.type, &g[b][i * F], aq[b].data() + i * arow, F, be_);
      ys[b].resize(size_t(n) * E);
      jobs.push_back({ew.down.type, rows_of(ew.down), E, F, aq[b].data(), arow, nullptr, n,
                      ys[b].data(), rows8_of(ew.down)});
    }
    kernels::matmul_batch(jobs.data(), jobs.size(), &pool_, be_);
    for (size_t b = 0; b < nb; ++b) {
      const auto& outs = r.outs[idx[b]];
      if (ws[b].down_b)
        for (size_t i = 0; i < outs.size(); ++i)
          for (int64_t e = 0; e < E; ++e) ys[b][i * E + e] += ws[b].down_b.f32()[e];
      for (size_t i = 0; i < outs.size(); ++i)
        std::copy(ys[b].begin() + i * E, ys[b].begin() + (i + 1) * E,
                  moe_.out.begin() + size_t(outs[i]) * E);
    }
  }

  void moe_end(Act out) override {
    const MoeRoutes& r = *moe_.r;
    const int64_t E = out.cols, K = r.k;
    for (int64_t t = 0; t < out.rows; ++t) {
      float* o = out.row(t);
      for (int64_t k = 0; k < K; ++k) {
        const float wk = r.weights[size_t(t) * K + k];
        const float* e = &moe_.out[size_t(t * K + k) * E];
        if (k == 0)
          for (int64_t i = 0; i < E; ++i) o[i] = e[i] * wk;
        else
          for (int64_t i = 0; i < E; ++i) o[i] += e[i] * wk;
      }
    }
  }

 private:
  struct Cache {
    KvRows rows;
    bool f16 = false;
    // F32: [pos][rows], then the kv_state; F16: the same. On cache lines: attention's loads of a
    // row split no line (a row of 16-byte-aligned storage costs it ~30% more).
    expertd::AlignedVector<float> k, v, kvs;
    expertd::AlignedVector<uint16_t> k16, v16, kvs16;
    std::vector<float> state;
    // n values of a key row from `offset` (a whole row: n = 0)
    void store_k(int64_t pos, const float* x, int64_t n = 0, int64_t offset = 0) {
      if (n == 0) n = rows.k;
      const size_t at = size_t(pos * rows.k + offset);
      f16 ? kernels::to_f16(x, &k16[at], n) : void(std::copy_n(x, n, &k[at]));
    }
    void store_v(int64_t pos, const float* x) {
      const size_t at = size_t(pos * rows.v);
      f16 ? kernels::to_f16(x, &v16[at], rows.v) : void(std::copy_n(x, rows.v, &v[at]));
    }
  };
  struct Quantized {  // a layer's inputs quantized for the gate/up activation type
    uint32_t type = ~0u;
    size_t row = 0;
    std::vector<uint8_t> buf;
  };

  const Quantized& quantized_h(uint32_t wtype) {
    const uint32_t vt = kernels::vec_dot_type(wtype);
    for (auto& c : moe_.hq)
      if (c.type == vt) return c;
    Quantized& c =
        moe_.hq[0].type == ~0u ? moe_.hq[0] : moe_.hq[1];  // gate and up: at most two types
    const int64_t E = moe_.h.cols, T = moe_.h.rows;
    c.type = vt, c.row = kernels::row_size(vt, E), c.buf.resize(c.row * T);
    for (int64_t t = 0; t < T; ++t)
      kernels::quantize_activations(wtype, moe_.h.row(t), c.buf.data() + t * c.row, E, be_);
    return c;
  }

  kernels::ThreadPool pool_;
  InterleavedWeights rows8_;  // the matrices decode reads interleaved (engine/interleaved.h)
  kernels::Isa be_;
  kernels::Scratch scratch_;
  HostArena arena_;
  int n_ctx_ = 0, n_layer_ = 0;
  bool f16_ = false;  // the caches' type (KvType::F16)
  Cache& cache(int slot, int il) { return cache_[size_t(slot) * n_layer_ + il]; }
  std::vector<Cache> cache_;  // [slot][layer]
  // The MoE layer in progress; buffers kept across layers and calls.
  struct {
    Act h;
    const MoeRoutes* r = nullptr;
    std::array<Quantized, 2> hq;
    std::vector<float> out;  // per (token, k) expert outputs, summed in router order by moe_end
    std::vector<kernels::MatmulJob> jobs;
    std::vector<std::vector<float>> g, u, ys;
    std::vector<std::vector<uint8_t>> aq;
  } moe_;
};

}  // namespace

std::unique_ptr<Ops> make_cpu_ops(int n_threads, const Model* interleave, bool experts) {
  auto ops = std::make_unique<CpuOps>(n_threads);
  if (interleave) ops->interleave(*interleave, experts);
  return ops;
}

}  // namespace engine
