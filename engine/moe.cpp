// The MoE block every architecture shares: routing, the layer's unique experts fetched once
// through the ExpertSource (hits first while misses load; chunks of the daemon's per-request
// limit), the backend's expert computation, the shared expert, and next-layer prefetch hints.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/engine.h"

namespace engine {

void select_experts(const RouteOpts& o, const Tensor& exp_probs_b, int X, int K, float* p, Route& r,
                    const int32_t* forced) {
  if (o.topk_then_softmax) {  // gpt-oss: the k largest logits, then a softmax over them
    std::vector<uint32_t> idx(X);
    std::iota(idx.begin(), idx.end(), 0u);
    std::stable_sort(idx.begin(), idx.end(), [&](uint32_t a, uint32_t b) { return p[a] > p[b]; });
    r.experts.assign(idx.begin(), idx.begin() + K);
    r.weights.clear();
    for (uint32_t e : r.experts) r.weights.push_back(p[e]);
    kernels::softmax(r.weights.data(), K);
    return;
  }
  if (o.sqrt_softplus)  // ggml's softplus, then its sqrt
    for (int e = 0; e < X; ++e)
      p[e] = std::sqrt(p[e] > 20.0f ? p[e] : std::log(1.0f + std::exp(p[e])));
  else if (o.sigmoid)
    for (int e = 0; e < X; ++e) p[e] = 1.0f / (1.0f + std::exp(-p[e]));
  else
    kernels::softmax(p, X);
  auto weigh = [&] {
    r.weights.clear();
    float sum = 0;
    for (uint32_t e : r.experts) r.weights.push_back(p[e]), sum += p[e];
    if (o.norm_topk)
      for (float& x : r.weights) x /= std::max(sum, 6.103515625e-5f);
    if (o.w_scale != 1.0f)
      for (float& x : r.weights) x *= o.w_scale;
  };
  if (forced) {
    r.experts.assign(forced, forced + K);
    return weigh();
  }
  std::vector<float> sel(p, p + X);
  if (exp_probs_b)
    for (int e = 0; e < X; ++e) sel[e] += exp_probs_b.f32()[e];
  if (o.n_group > 1) {
    const int G = o.n_group, per = X / G;
    std::vector<float> score(G);
    for (int g = 0; g < G; ++g) {
      std::vector<float> v(sel.begin() + g * per, sel.begin() + (g + 1) * per);
      std::partial_sort(v.begin(), v.begin() + 2, v.end(), std::greater<float>());
      score[g] = v[0] + v[1];
    }
    std::vector<int> order(G);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return score[a] > score[b]; });
    for (int i = o.n_group_used; i < G; ++i)
      for (int e = order[i] * per; e < (order[i] + 1) * per; ++e) sel[e] = -INFINITY;
  }
  std::vector<uint32_t> idx(X);
  std::iota(idx.begin(), idx.end(), 0u);
  std::stable_sort(idx.begin(), idx.end(), [&](uint32_t a, uint32_t b) { return sel[a] > sel[b]; });
  r.experts.assign(idx.begin(), idx.begin() + K);
  weigh();
}

void top_k_row(const float* x, int64_t n, int k, int32_t* ids) {
  thread_local std::vector<int32_t> order;
  const int64_t m = std::min<int64_t>(n, k);
  order.resize(size_t(n));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + m, order.end(),
                    [&](int32_t a, int32_t b) { return x[a] > x[b]; });
  for (int64_t j = 0; j < m; ++j) ids[j] = x[order[j]] == -INFINITY ? -1 : order[j];
  std::fill(ids + m, ids + k, -1);
}

void hadamard_row(float* x, int64_t n) {
  const float scale = 1.0f / std::sqrt(float(n));
  for (int64_t i = 0; i < n; ++i) x[i] *= scale;
  for (int64_t len = 1; len < n; len <<= 1)
    for (int64_t i = 0; i < n; i += 2 * len)
      for (int64_t j = i; j < i + len; ++j) {
        const float u = x[j], v = x[j + len];
        x[j] = u + v, x[j + len] = u - v;
      }
}

float index_score(const float* q, const float* w, const float* k, int heads, int64_t dim,
                  float scale, kernels::Isa be) {
  float sum = 0.0f;
  for (int h = 0; h < heads; ++h)
    sum += std::max(kernels::dot_f32_ggml(q + h * dim, k, dim, be), 0.0f) * (w[h] * scale);
  return sum;
}

void Ops::route(Act logits, const MoeWeights& w, int k, const int32_t* forced,
                std::vector<Route>& out) {
  std::vector<float> host(size_t(logits.rows) * logits.cols);
  to_host(logits, host.data());
  out.resize(logits.rows);
  for (int64_t t = 0; t < logits.rows; ++t)
    select_experts(w.route, w.exp_probs_b, static_cast<int>(logits.cols), k,
                   &host[size_t(t) * logits.cols], out[t], forced ? forced + t * k : nullptr);
}

// Hash routing: each token's experts from the layer's table (ids checked when the model loads).
static std::vector<int32_t> hashed_experts(const MoeWeights& w, std::span<const int32_t> tokens,
                                           int K) {
  std::vector<int32_t> ids(tokens.size() * K);
  const auto* table = reinterpret_cast<const int32_t*>(w.tid2eid.data);
  for (size_t t = 0; t < tokens.size(); ++t)
    std::copy_n(table + size_t(tokens[t]) * K, K, ids.begin() + t * K);
  return ids;
}

std::vector<uint32_t> likely_experts(const float* logits, int T, int X, int K) {
  std::vector<bool> want(X, false);
  std::vector<uint32_t> idx(X);
  for (int t = 0; t < T; ++t) {
    const float* p = logits + size_t(t) * X;
    std::iota(idx.begin(), idx.end(), 0u);
    std::partial_sort(idx.begin(), idx.begin() + K, idx.end(),
                      [&](uint32_t a, uint32_t b) { return p[a] > p[b]; });
    for (int k = 0; k < K; ++k) want[idx[k]] = true;
  }
  std::vector<uint32_t> ids;
  for (int e = 0; e < X; ++e)
    if (want[e]) ids.push_back(static_cast<uint32_t>(e));
  return ids;
}

// The next MoE layers' routers (1 and 2 layers ahead) on the residual stream as it is now
// (after this layer's attention), normalised with their norms: their top-k experts are the
// prediction, scored when those layers route; the next layer's is hinted to the source. Hints
// never change the math.
// The hash-routed layers' experts, known from the eval's tokens: hinted before the first layer
// runs (layer 0 included, which no router ahead of it could predict).
void Engine::prefetch_hashed() {
  for (int il = 0; il < m_.hp.n_layer; ++il) {
    const MoeWeights* w = m_.moe(il);
    if (!w || !w->tid2eid) continue;
    std::vector<int32_t> ids = hashed_experts(*w, tokens_, m_.hp.n_expert_used);
    auto& p = hashed_[il];
    p.assign(ids.begin(), ids.end());
    std::sort(p.begin(), p.end());
    p.erase(std::unique(p.begin(), p.end()), p.end());
    if (experts_.wants_hints()) experts_.prefetch(il, p);
  }
}

void Engine::prefetch_next(int il) {
  for (int d = 1; d <= (two_ahead_ ? 2 : 1) && il + d < m_.hp.n_layer; ++d) {
    const MoeWeights* next = m_.moe(il + d);
    if (!next || next->tid2eid) continue;  // hash-routed: hinted when the eval began
    const size_t mark = ops_->mark();
    Act h = ops_->rms_norm(m_.arch->router_stream(*this, x_), next->norm, m_.hp.eps);
    Act lg = ops_->matmul(next->router, h);
    std::vector<float> host(size_t(lg.rows) * lg.cols);
    ops_->to_host(lg, host.data());
    ops_->release_to(mark);
    auto& p = predicted_[d - 1][il + d];
    p = likely_experts(host.data(), static_cast<int>(lg.rows), m_.hp.n_expert, m_.hp.n_expert_used);
    if (d == 1 && experts_.wants_hints()) experts_.prefetch(il + 1, p);
  }
}

void Engine::score_predictions(int il, const std::vector<uint32_t>& used) {
  if (auto& p = hashed_[il]; !p.empty()) {
    PredictionStats& s = hashed_stats_[il];
    s.used += used.size(), s.predicted += p.size();
    for (uint32_t e : p) s.correct += std::binary_search(used.begin(), used.end(), e);
    p.clear();
  }
  for (int d = 0; d < 2; ++d) {
    auto& p = predicted_[d][il];
    if (p.empty()) continue;
    PredictionStats& s = pred_stats_[d][il];
    s.used += used.size(), s.predicted += p.size();
    for (uint32_t e : p) s.correct += std::binary_search(used.begin(), used.end(), e);
    p.clear();
  }
}

void group_routes(std::span<const Route> routes, int n_expert, int k, MoeRoutes& r) {
  const int T = static_cast<int>(routes.size()), K = k;
  r.n_tokens = T, r.k = K;
  r.experts.clear();
  r.weights.resize(size_t(T) * K);
  std::vector<std::pair<int, int>> uses;  // (expert, t * K + k) in token order
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < K; ++j) {
      uses.push_back({static_cast<int>(routes[t].experts[j]), t * K + j});
      r.weights[size_t(t) * K + j] = routes[t].weights[j];
    }
  std::vector<int> index_of(n_expert, -1);  // expert -> its place among the unique ones
  for (auto [e, row] : uses) index_of[e] = 0;
  for (int e = 0; e < n_expert; ++e)
    if (index_of[e] >= 0)
      index_of[e] = static_cast<int>(r.experts.size()),
      r.experts.push_back(static_cast<uint32_t>(e));
  r.tokens.resize(r.experts.size());
  r.outs.resize(r.experts.size());
  for (size_t i = 0; i < r.experts.size(); ++i) r.tokens[i].clear(), r.outs[i].clear();
  for (auto [e, row] : uses)
    r.tokens[index_of[e]].push_back(row / K), r.outs[index_of[e]].push_back(row);
}

Act Engine::moe(int il, const MoeWeights& w, Act h, Act x) {
  const int T = static_cast<int>(h.rows), X = m_.hp.n_expert, K = m_.hp.n_expert_used;
  if (prefetch_) prefetch_next(il);
  Act logits = ops_->matmul(w.router, h);
  if (w.router_b) ops_->add_bias(logits, w.router_b);
  Act out = ops_->alloc(T, x.cols);
  // The model's own experts resident in the backend, routed there: no routes on the host.
  if (!w.tid2eid && !prefetch_ && !w.route.weight_before && experts_.model_owned() &&
      ops_->moe_resident(logits, w, K, x, out))
    return shared_expert(w, h, out);
  auto& routes = routes_[il];
  std::vector<int32_t> forced;
  if (w.tid2eid) forced = hashed_experts(w, tokens_, K);
  ops_->route(logits, w, K, forced.empty() ? nullptr : forced.data(), routes);
  MoeRoutes& r = moe_routes_;
  group_routes(routes, X, K, r);
  if (prefetch_) score_predictions(il, r.experts);  // ascending, unique
  if (w.route.weight_before) {  // each route's input scaled by its weight, the outputs summed
    // (llama.cpp's Llama 4): route row t * K + j reads its own copy of token t's row.
    Act xs = ops_->alloc(T, K * x.cols);
    ops_->repeat(x, K, xs);
    xs = Act{xs.data, int64_t{T} * K, x.cols};
    ops_->scale_rows(xs, r.weights);
    std::fill(r.weights.begin(), r.weights.end(), 1.0f);
    for (size_t i = 0; i < r.tokens.size(); ++i) r.tokens[i] = r.outs[i];
    x = xs;
  }
  ops_->moe_begin(x, r);
  auto st = experts_.for_each_batch(
      il, r.experts, [&](std::span<const size_t> idx, std::span<const ExpertWeights> ws) {
        ops_->moe_experts(w, idx, ws);
      });
  if (!st && first_error_) first_error_ = st;
  ops_->moe_end(out);
  return shared_expert(w, h, out);
}

Act Engine::shared_expert(const MoeWeights& w, Act h, Act out) {
  if (w.gate_shexp) {
    Act shared = ops_->alloc(h.rows, m_.hp.n_embd);
    ops_->ffn({w.gate_shexp, w.up_shexp, w.down_shexp, w.shexp_act.value_or(w.act)}, h, shared);
    ops_->add_gated(out, shared, w.shexp_gate, h);
  }
  return out;
}

}  // namespace engine
