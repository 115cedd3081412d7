#include "engine/engine.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>

namespace engine {

using expertd::make_error;

Engine::Engine(const Model& m, ExpertSource& experts, int n_threads, int n_ctx)
    : m_(m), experts_(experts), pool_(n_threads), n_ctx_(n_ctx) {
  // MLA caches one latent row per position (kv_lora + n_rot floats = head_dim, one "KV head")
  // that serves as keys and, its first kv_lora floats, as values.
  size_t per_layer = size_t(n_ctx) * m.hp.n_head_kv * m.hp.head_dim;
  k_cache_.assign(per_layer * m.hp.n_layer, 0.0f);
  if (!m.arch->mla) v_cache_.assign(per_layer * m.hp.n_layer, 0.0f);
}

void Engine::matmul(const Tensor& w, const float* x, int T, float* y) {
  kernels::matmul(w.type, w.data, w.ne[1], w.ne[0], x, T, y, scratch_, &pool_);
}

void Engine::attention(int il, int T, const float* h, float* out) {
  const Hparams& hp = m_.hp;
  const LayerWeights& w = m_.layers[il];
  const int D = hp.head_dim, H = hp.n_head, HKV = hp.n_head_kv, Q = H * D, KV = HKV * D;
  auto& q = buf_.q, &k = buf_.k, &v = buf_.v;
  q.resize(size_t(T) * Q), k.resize(size_t(T) * KV), v.resize(size_t(T) * KV);
  matmul(w.wq, h, T, q.data());
  matmul(w.wk, h, T, k.data());
  matmul(w.wv, h, T, v.data());
  for (int t = 0; t < T; ++t) {
    float *qt = &q[size_t(t) * Q], *kt = &k[size_t(t) * KV], *vt = &v[size_t(t) * KV];
    if (w.bq) {
      for (int i = 0; i < Q; ++i) qt[i] += w.bq.f32()[i];
      for (int i = 0; i < KV; ++i) kt[i] += w.bk.f32()[i], vt[i] += w.bv.f32()[i];
    }
    if (m_.arch->qk_norm == QkNorm::Full) {
      kernels::rms_norm(qt, w.q_norm.f32(), qt, Q, hp.eps);
      kernels::rms_norm(kt, w.k_norm.f32(), kt, KV, hp.eps);
    } else if (w.q_norm) {  // per head: qwen3moe, and glm4moe where present
      for (int hh = 0; hh < H; ++hh) kernels::rms_norm(qt + hh * D, w.q_norm.f32(), qt + hh * D, D, hp.eps);
      for (int hh = 0; hh < HKV; ++hh) kernels::rms_norm(kt + hh * D, w.k_norm.f32(), kt + hh * D, D, hp.eps);
    }
    const int pos = n_past_ + t;
    const kernels::Yarn* yarn = hp.yarn ? &hp.yarn_params : nullptr;
    for (int hh = 0; hh < H; ++hh) kernels::rope(qt + hh * D, D, hp.n_rot, pos, hp.rope_base, m_.arch->rope_neox, yarn);
    for (int hh = 0; hh < HKV; ++hh) kernels::rope(kt + hh * D, D, hp.n_rot, pos, hp.rope_base, m_.arch->rope_neox, yarn);
    size_t at = (size_t(il) * n_ctx_ + pos) * KV;
    std::copy(kt, kt + KV, k_cache_.begin() + at);
    std::copy(vt, vt + KV, v_cache_.begin() + at);
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int group = H / HKV;
  const kernels::Backend be = kernels::best_backend();
  const int swa = m_.arch->swa_period && il % m_.arch->swa_period == 0 ? hp.swa : 0;
  pool_.parallel_for(int64_t(T) * H, 1, [&](int64_t b, int64_t e) {
    std::vector<float> s(n_past_ + T);
    for (int64_t job = b; job < e; ++job) {
      const int t = static_cast<int>(job / H), hh = static_cast<int>(job % H), kvh = hh / group;
      const int n_keys = n_past_ + t + 1;  // causal
      const float* qt = &q[size_t(t) * Q + hh * D];
      const float* kbase = &k_cache_[size_t(il) * n_ctx_ * KV];
      const float* vbase = &v_cache_[size_t(il) * n_ctx_ * KV];
      // Sliding window: key j is visible iff pos - j < window.
      const int first = swa > 0 ? std::max(0, n_keys - swa) : 0;
      kernels::attend(qt, kbase + size_t(first) * KV + kvh * D, vbase + size_t(first) * KV + kvh * D, n_keys - first, KV,
                      KV, D, D, scale, w.sinks ? w.sinks.f32()[hh] : -INFINITY, s.data(), out + size_t(t) * Q + hh * D, be);
    }
  });
}

// Multi-head latent attention as llama.cpp computes it ("absorbed"): each head's query is taken
// into the latent space with attn_k_b, attention runs over the cached latent rows, and attn_v_b
// takes each head's result back out. Writes n_head * v_mla values per token.
void Engine::attention_mla(int il, int T, const float* h, float* out) {
  const Hparams& hp = m_.hp;
  const LayerWeights& w = m_.layers[il];
  const int H = hp.n_head, R = hp.n_rot, C = hp.kv_lora, KL = C + R, nope = hp.k_mla - R, HK = H * hp.k_mla;
  auto& q = buf_.q, &kv = buf_.k, &tmp = buf_.v;
  q.resize(size_t(T) * HK), kv.resize(size_t(T) * KL);
  if (w.wq_a) {
    tmp.resize(size_t(T) * hp.q_lora);
    matmul(w.wq_a, h, T, tmp.data());
    for (int t = 0; t < T; ++t)
      kernels::rms_norm(&tmp[size_t(t) * hp.q_lora], w.q_a_norm.f32(), &tmp[size_t(t) * hp.q_lora], hp.q_lora, hp.eps);
    matmul(w.wq_b, tmp.data(), T, q.data());
  } else {
    matmul(w.wq, h, T, q.data());
  }
  matmul(w.wkv_a, h, T, kv.data());
  float* cache = &k_cache_[size_t(il) * n_ctx_ * KL];
  for (int t = 0; t < T; ++t) {
    const int pos = n_past_ + t;
    float* row = cache + size_t(pos) * KL;
    kernels::rms_norm(&kv[size_t(t) * KL], w.kv_a_norm.f32(), row, C, hp.eps);
    std::copy(&kv[size_t(t) * KL + C], &kv[size_t(t) * KL + KL], row + C);
    const kernels::Yarn* yarn = hp.yarn ? &hp.yarn_params : nullptr;
    kernels::rope(row + C, R, R, pos, hp.rope_base, m_.arch->rope_neox, yarn);
    for (int hh = 0; hh < H; ++hh)
      kernels::rope(&q[(size_t(t) * H + hh) * hp.k_mla + nope], R, R, pos, hp.rope_base, m_.arch->rope_neox, yarn);
  }
  // Per head: q_abs = k_b[h] . q_nope (T x kv_lora), then the full query [q_abs, q_pe].
  auto& qf = buf_.qf;
  qf.resize(size_t(T) * H * KL);
  auto &xin = buf_.mla_in, &yout = buf_.mla_out;
  xin.resize(size_t(T) * std::max(nope, C)), yout.resize(size_t(T) * std::max(C, hp.v_mla));
  const size_t kb_head = kernels::row_size(w.wk_b.type, nope) * C, vb_head = kernels::row_size(w.wv_b.type, C) * hp.v_mla;
  for (int hh = 0; hh < H; ++hh) {
    for (int t = 0; t < T; ++t)
      std::copy_n(&q[(size_t(t) * H + hh) * hp.k_mla], nope, &xin[size_t(t) * nope]);
    Tensor kb = w.wk_b;
    kb.data = w.wk_b.data + kb_head * hh, kb.ne = {nope, C, 1};
    matmul(kb, xin.data(), T, yout.data());
    for (int t = 0; t < T; ++t) {
      float* dst = &qf[(size_t(t) * H + hh) * KL];
      std::copy_n(&yout[size_t(t) * C], C, dst);
      std::copy_n(&q[(size_t(t) * H + hh) * hp.k_mla + nope], R, dst + C);
    }
  }
  // Attention over the latent rows: keys are whole rows, values their first kv_lora floats.
  auto& lat = buf_.att2;
  lat.resize(size_t(T) * H * C);
  const float scale = hp.mla_mscale * hp.mla_mscale / std::sqrt(static_cast<float>(hp.k_mla));
  const kernels::Backend be = kernels::best_backend();
  pool_.parallel_for(int64_t(T) * H, 1, [&](int64_t b, int64_t e) {
    std::vector<float> s(n_past_ + T);
    for (int64_t job = b; job < e; ++job) {
      const int t = static_cast<int>(job / H), hh = static_cast<int>(job % H);
      kernels::attend(&qf[(size_t(t) * H + hh) * KL], cache, cache, n_past_ + t + 1, KL, KL, KL, C, scale, -INFINITY,
                      s.data(), &lat[(size_t(t) * H + hh) * C], be);
    }
  });
  // Per head back out of the latent space: v_b[h] . lat (T x v_mla).
  for (int hh = 0; hh < H; ++hh) {
    for (int t = 0; t < T; ++t) std::copy_n(&lat[(size_t(t) * H + hh) * C], C, &xin[size_t(t) * C]);
    Tensor vb = w.wv_b;
    vb.data = w.wv_b.data + vb_head * hh, vb.ne = {C, hp.v_mla, 1};
    matmul(vb, xin.data(), T, yout.data());
    for (int t = 0; t < T; ++t) std::copy_n(&yout[size_t(t) * hp.v_mla], hp.v_mla, out + (size_t(t) * H + hh) * hp.v_mla);
  }
}

void Engine::dense_ffn(const Tensor& g, const Tensor& u, const Tensor& d, int T, const float* h, float* out) {
  const int64_t F = g.ne[1];
  std::vector<float> a(size_t(T) * F), b(size_t(T) * F);
  matmul(g, h, T, a.data());
  matmul(u, h, T, b.data());
  for (size_t i = 0; i < a.size(); ++i) a[i] = kernels::silu(a[i]) * b[i];
  matmul(d, a.data(), T, out);
}

// Gate scores (softmax or sigmoid of the router logits); selection by score plus exp_probs_b
// within the best expert groups; weights are the selected experts' unbiased scores, optionally
// renormalised, times w_scale. Ties go to the lower expert id (llama.cpp's stable order).
void select_experts(const Model& m, const LayerWeights& w, float* p, Route& r) {
  const Hparams& hp = m.hp;
  const int X = hp.n_expert, K = hp.n_expert_used;
  if (m.arch->topk_then_softmax) {  // gpt-oss: the k largest logits, then a softmax over them
    std::vector<uint32_t> idx(X);
    std::iota(idx.begin(), idx.end(), 0u);
    std::stable_sort(idx.begin(), idx.end(), [&](uint32_t a, uint32_t b) { return p[a] > p[b]; });
    r.experts.assign(idx.begin(), idx.begin() + K);
    r.weights.clear();
    for (uint32_t e : r.experts) r.weights.push_back(p[e]);
    kernels::softmax(r.weights.data(), K);
    return;
  }
  if (hp.gating_sigmoid)
    for (int e = 0; e < X; ++e) p[e] = 1.0f / (1.0f + std::exp(-p[e]));
  else
    kernels::softmax(p, X);
  std::vector<float> sel(p, p + X);
  if (w.exp_probs_b)
    for (int e = 0; e < X; ++e) sel[e] += w.exp_probs_b.f32()[e];
  if (hp.n_group > 1) {
    const int G = hp.n_group, per = X / G;
    std::vector<float> score(G);
    for (int g = 0; g < G; ++g) {
      std::vector<float> v(sel.begin() + g * per, sel.begin() + (g + 1) * per);
      std::partial_sort(v.begin(), v.begin() + 2, v.end(), std::greater<float>());
      score[g] = v[0] + v[1];
    }
    std::vector<int> order(G);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return score[a] > score[b]; });
    for (int i = hp.n_group_used; i < G; ++i)
      for (int e = order[i] * per; e < (order[i] + 1) * per; ++e) sel[e] = -INFINITY;
  }
  std::vector<uint32_t> idx(X);
  std::iota(idx.begin(), idx.end(), 0u);
  std::stable_sort(idx.begin(), idx.end(), [&](uint32_t a, uint32_t b) { return sel[a] > sel[b]; });
  r.experts.assign(idx.begin(), idx.begin() + K);
  r.weights.clear();
  float sum = 0;
  for (uint32_t e : r.experts) r.weights.push_back(p[e]), sum += p[e];
  if (hp.norm_topk)
    for (float& x : r.weights) x /= std::max(sum, 6.103515625e-5f);
  if (hp.w_scale != 1.0f)
    for (float& x : r.weights) x *= hp.w_scale;
}

expertd::Status Engine::moe(int il, int T, const float* h, float* out) {
  const Hparams& hp = m_.hp;
  const LayerWeights& w = m_.layers[il];
  const int E = hp.n_embd, X = hp.n_expert, K = hp.n_expert_used;
  std::vector<float> logits(size_t(T) * X);
  matmul(w.router, h, T, logits.data());
  if (w.router_b)
    for (int t = 0; t < T; ++t)
      for (int e = 0; e < X; ++e) logits[size_t(t) * X + e] += w.router_b.f32()[e];
  auto& routes = routes_[il];
  routes.assign(T, {});
  // Tokens of each expert: (token, k) pairs, so each unique expert is fetched once per layer.
  std::vector<std::vector<std::pair<int, int>>> users(X);
  for (int t = 0; t < T; ++t) {
    Route& r = routes[t];
    select_experts(m_, w, &logits[size_t(t) * X], r);
    for (int k = 0; k < K; ++k) users[r.experts[k]].push_back({t, k});
  }
  std::vector<uint32_t> unique;
  for (int e = 0; e < X; ++e)
    if (!users[e].empty()) unique.push_back(static_cast<uint32_t>(e));
  std::vector<std::vector<int32_t>> toks(unique.size());
  for (size_t ui = 0; ui < unique.size(); ++ui)
    for (auto [t, k] : users[unique[ui]]) toks[ui].push_back(t);
  // The tokens' inputs quantized once per layer for each activation type the gate and up use.
  auto& hq = buf_.hq;  // buffers kept across layers; which activation types they hold is per layer
  for (auto& c : hq) c.type = ~0u;
  auto quantized_h = [&](uint32_t wtype) -> const Buffers::Quantized& {
    const uint32_t vt = kernels::vec_dot_type(wtype);
    for (auto& c : hq)
      if (c.type == vt) return c;
    Buffers::Quantized& c = hq[0].type == ~0u ? hq[0] : hq[1];  // gate and up: at most two types
    c.type = vt, c.row = kernels::row_size(vt, E), c.buf.resize(c.row * T);
    for (int t = 0; t < T; ++t) kernels::quantize_activations(wtype, h + size_t(t) * E, c.buf.data() + t * c.row, E);
    return c;
  };
  // Per (token, k) expert outputs; summed below in router order.
  auto& expert_out = buf_.expert_out;
  expert_out.resize(size_t(T) * K * E);  // every (token, k) row is written below
  auto& jobs = buf_.jobs;
  auto &g = buf_.g, &u = buf_.u, &ys = buf_.ys;
  auto& aq = buf_.aq;
  // Each batch of available experts: gate and up of all of them in one parallel loop, SwiGLU, then
  // all their down projections in another (two fork-joins per batch, not three per expert).
  auto st = experts_.for_each_batch(il, unique, [&](std::span<const size_t> idx, std::span<const ExpertWeights> ws) {
    const size_t nb = idx.size();
    g.resize(nb), u.resize(nb), ys.resize(nb), aq.resize(nb);
    jobs.clear();
    for (size_t b = 0; b < nb; ++b) {
      const auto& tk = toks[idx[b]];
      const int64_t n = static_cast<int64_t>(tk.size()), F = ws[b].gate.ne[1];
      g[b].resize(n * F), u[b].resize(n * F);
      const auto& qg = quantized_h(ws[b].gate.type);
      const auto& qu = quantized_h(ws[b].up.type);
      jobs.push_back({ws[b].gate.type, ws[b].gate.data, F, E, qg.buf.data(), qg.row, tk.data(), n, g[b].data()});
      jobs.push_back({ws[b].up.type, ws[b].up.data, F, E, qu.buf.data(), qu.row, tk.data(), n, u[b].data()});
    }
    kernels::matmul_batch(jobs.data(), jobs.size(), &pool_);
    jobs.clear();
    for (size_t b = 0; b < nb; ++b) {
      const ExpertWeights& ew = ws[b];
      const int64_t n = static_cast<int64_t>(toks[idx[b]].size()), F = ew.gate.ne[1];
      if (ew.gate_b)
        for (int64_t i = 0; i < n; ++i)
          for (int64_t j = 0; j < F; ++j) g[b][i * F + j] += ew.gate_b.f32()[j], u[b][i * F + j] += ew.up_b.f32()[j];
      if (m_.arch->swiglu_oai) {
        for (size_t i = 0; i < g[b].size(); ++i) {
          const float x = std::min(g[b][i], 7.0f), y = std::clamp(u[b][i], -7.0f, 7.0f);
          g[b][i] = x / (1.0f + std::exp(-1.702f * x)) * (y + 1.0f);
        }
      } else {
        for (size_t i = 0; i < g[b].size(); ++i) g[b][i] = kernels::silu(g[b][i]) * u[b][i];
      }
      const size_t arow = kernels::row_size(kernels::vec_dot_type(ew.down.type), F);
      aq[b].resize(arow * n);
      for (int64_t i = 0; i < n; ++i) kernels::quantize_activations(ew.down.type, &g[b][i * F], aq[b].data() + i * arow, F);
      ys[b].resize(size_t(n) * E);
      jobs.push_back({ew.down.type, ew.down.data, E, F, aq[b].data(), arow, nullptr, n, ys[b].data()});
    }
    kernels::matmul_batch(jobs.data(), jobs.size(), &pool_);
    for (size_t b = 0; b < nb; ++b) {
      const auto& us = users[unique[idx[b]]];
      if (ws[b].down_b)
        for (size_t i = 0; i < us.size(); ++i)
          for (int e = 0; e < E; ++e) ys[b][i * E + e] += ws[b].down_b.f32()[e];
      for (size_t i = 0; i < us.size(); ++i)
        std::copy(ys[b].begin() + i * E, ys[b].begin() + (i + 1) * E, expert_out.begin() + (size_t(us[i].first) * K + us[i].second) * E);
    }
  });
  if (!st) return st;
  for (int t = 0; t < T; ++t) {
    float* o = out + size_t(t) * E;
    for (int k = 0; k < K; ++k) {
      const float wk = routes[t].weights[k];
      const float* e = &expert_out[(size_t(t) * K + k) * E];
      if (k == 0) for (int i = 0; i < E; ++i) o[i] = e[i] * wk;
      else for (int i = 0; i < E; ++i) o[i] += e[i] * wk;
    }
  }
  if (w.gate_shexp) {
    std::vector<float> shared(size_t(T) * E);
    dense_ffn(w.gate_shexp, w.up_shexp, w.down_shexp, T, h, shared.data());
    for (int t = 0; t < T; ++t) {
      float gate = 1.0f;
      if (w.shexp_gate) {
        float z = 0;
        for (int i = 0; i < E; ++i) z += w.shexp_gate.f32()[i] * h[size_t(t) * E + i];
        gate = 1.0f / (1.0f + std::exp(-z));
      }
      for (int i = 0; i < E; ++i) out[size_t(t) * E + i] += gate * shared[size_t(t) * E + i];
    }
  }
  return {};
}

void Engine::prefetch_next(int il, int T, const float* x) {
  const Hparams& hp = m_.hp;
  if (il + 1 >= hp.n_layer || !m_.layers[il + 1].is_moe()) return;
  const LayerWeights& next = m_.layers[il + 1];
  const int E = hp.n_embd, X = hp.n_expert;
  std::vector<float> h(size_t(T) * E), logits(size_t(T) * X);
  for (int t = 0; t < T; ++t) kernels::rms_norm(x + size_t(t) * E, next.ffn_norm.f32(), &h[size_t(t) * E], E, hp.eps);
  matmul(next.router, h.data(), T, logits.data());
  experts_.prefetch(il + 1, likely_experts(logits.data(), T, X, hp.n_expert_used));
}

std::vector<uint32_t> likely_experts(const float* logits, int T, int X, int K) {
  std::vector<bool> want(X, false);
  std::vector<uint32_t> idx(X);
  for (int t = 0; t < T; ++t) {
    const float* p = logits + size_t(t) * X;
    std::iota(idx.begin(), idx.end(), 0u);
    std::partial_sort(idx.begin(), idx.begin() + K, idx.end(), [&](uint32_t a, uint32_t b) { return p[a] > p[b]; });
    for (int k = 0; k < K; ++k) want[idx[k]] = true;
  }
  std::vector<uint32_t> ids;
  for (int e = 0; e < X; ++e)
    if (want[e]) ids.push_back(static_cast<uint32_t>(e));
  return ids;
}

expertd::Status Engine::eval(std::span<const int32_t> tokens, bool all_logits, std::vector<float>& logits) {
  const Hparams& hp = m_.hp;
  const int T = static_cast<int>(tokens.size()), E = hp.n_embd;
  if (T == 0) return make_error("no tokens to evaluate");
  if (n_past_ + T > n_ctx_)
    return make_error("context full: " + std::to_string(n_past_ + T) + " tokens exceed the context of " + std::to_string(n_ctx_));
  for (int32_t tok : tokens)
    if (tok < 0 || tok >= hp.n_vocab) return make_error("token id " + std::to_string(tok) + " is outside the vocabulary");
  auto &x = buf_.x, &h = buf_.h, &tmp = buf_.tmp, &att = buf_.att;
  x.resize(size_t(T) * E), h.resize(size_t(T) * E), tmp.resize(size_t(T) * std::max(E, hp.n_head * hp.head_dim));
  att.resize(size_t(T) * hp.n_head * std::max(hp.head_dim, hp.v_mla));
  const size_t emb_row = kernels::row_size(m_.tok_embd.type, E);
  for (int t = 0; t < T; ++t) kernels::dequantize_row(m_.tok_embd.type, m_.tok_embd.data + emb_row * tokens[t], &x[size_t(t) * E], E);
  routes_.assign(hp.n_layer, {});
  for (int il = 0; il < hp.n_layer; ++il) {
    const LayerWeights& w = m_.layers[il];
    for (int t = 0; t < T; ++t) kernels::rms_norm(&x[size_t(t) * E], w.attn_norm.f32(), &h[size_t(t) * E], E, hp.eps);
    if (m_.arch->mla) attention_mla(il, T, h.data(), att.data());
    else attention(il, T, h.data(), att.data());
    matmul(w.wo, att.data(), T, tmp.data());
    if (w.bo)
      for (int t = 0; t < T; ++t)
        for (int i = 0; i < E; ++i) tmp[size_t(t) * E + i] += w.bo.f32()[i];
    for (size_t i = 0; i < x.size(); ++i) x[i] += tmp[i];
    for (int t = 0; t < T; ++t) kernels::rms_norm(&x[size_t(t) * E], w.ffn_norm.f32(), &h[size_t(t) * E], E, hp.eps);
    if (w.is_moe()) {
      if (prefetch_) prefetch_next(il, T, x.data());
      if (auto st = moe(il, T, h.data(), tmp.data()); !st) return st;
    } else {
      dense_ffn(w.ffn_gate, w.ffn_up, w.ffn_down, T, h.data(), tmp.data());
    }
    for (size_t i = 0; i < x.size(); ++i) x[i] += tmp[i];
  }
  n_past_ += T;
  const int first = all_logits ? 0 : T - 1, rows = T - first;
  for (int t = first; t < T; ++t) kernels::rms_norm(&x[size_t(t) * E], m_.output_norm.f32(), &h[size_t(t - first) * E], E, hp.eps);
  logits.resize(size_t(rows) * hp.n_vocab);
  matmul(m_.output, h.data(), rows, logits.data());
  return {};
}

}  // namespace engine
