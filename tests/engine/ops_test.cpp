// Ops of the CPU backend against their definitions, in float64 (the per-op sweep holds the CUDA
// backend to the CPU's): the delta rule (engine::Ops::delta_rule, DeltaOpts) as KDA runs it and as
// the gated delta-net does (grouped key heads, a decay per head, values of another size), over a
// prefill and then a decoded token that reads the state the prefill left; the layer norm; top_k.
#include "engine/ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "delta_classes.h"
#include "engine/cpu_ops.h"
#include "kernels/kernels.h"

namespace {

using engine::Act;
using engine::DeltaOpts;
using expertd::test::normal;

engine::Tensor f32(const std::vector<float>& v, int64_t in, int64_t out) {
  engine::Tensor t;
  t.type = kernels::F32;
  t.ne = {in, out, 1};
  t.data = reinterpret_cast<const uint8_t*>(v.data());
  return t;
}

// The definition, in double: state carried across calls like the op's.
struct Reference {
  const DeltaOpts& o;
  const std::vector<float>&conv_q, &conv_k, &conv_v, &a;
  std::vector<double> win[3], S;
  Reference(const DeltaOpts& op, const std::vector<float>& cq, const std::vector<float>& ck,
            const std::vector<float>& cv, const std::vector<float>& av)
      : o(op), conv_q(cq), conv_k(ck), conv_v(cv), a(av) {
    const int64_t C = o.d_conv - 1;
    win[0].assign(size_t(C * o.n_k_head * o.dk), 0), win[1] = win[0];
    win[2].assign(size_t(C * o.n_v_head * o.dv), 0);
    S.assign(size_t(o.n_v_head * o.dk * o.dv), 0);
  }
  static double sigmoid(double x) { return 1 / (1 + std::exp(-x)); }
  // One token: q, k (Hk dk), v (Hv dv), g (Hv G), beta (Hv); the output (Hv dv).
  std::vector<double> step(std::vector<double> q, std::vector<double> k, std::vector<double> v,
                           const std::vector<double>& g, const std::vector<double>& beta) {
    const int64_t C = o.d_conv - 1, Hk = o.n_k_head, Hv = o.n_v_head, dk = o.dk, dv = o.dv;
    std::vector<double>* xs[3] = {&q, &k, &v};
    const std::vector<float>* ws[3] = {&conv_q, &conv_k, &conv_v};
    for (int m = 0; m < 3; ++m)
      for (size_t c = 0; c < xs[m]->size(); ++c) {
        double* wn = win[m].data() + c * size_t(C);
        const float* w = ws[m]->data() + c * size_t(C + 1);
        double sum = (*xs[m])[c] * w[C];
        for (int64_t j = 0; j < C; ++j) sum += wn[j] * w[j];
        for (int64_t j = 0; j + 1 < C; ++j) wn[j] = wn[j + 1];
        if (C > 0) wn[C - 1] = (*xs[m])[c];
        (*xs[m])[c] = sum * sigmoid(sum);
      }
    for (auto* x : {&q, &k})
      for (int64_t h = 0; h < Hk; ++h) {
        double ss = 0;
        for (int64_t i = 0; i < dk; ++i) ss += (*x)[h * dk + i] * (*x)[h * dk + i];
        for (int64_t i = 0; i < dk; ++i) (*x)[h * dk + i] /= std::sqrt(ss + o.eps);
      }
    std::vector<double> out(size_t(Hv * dv));
    const int64_t G = o.gate_width();
    for (int64_t h = 0; h < Hv; ++h) {
      const int64_t kh = o.tiled_heads ? h % Hk : h / (Hv / Hk);
      double* M = S.data() + h * dk * dv;  // M[j][i]: value j, key i
      const double b = sigmoid(beta[h]);
      for (int64_t i = 0; i < dk; ++i) {
        const double x = g[h * G + (G == 1 ? 0 : i)];
        const double gate = std::isfinite(o.lower_bound)
                                ? o.lower_bound * sigmoid((o.a_positive ? a[h] : -a[h]) * x)
                                : std::log1p(std::exp(x)) * a[h];
        for (int64_t j = 0; j < dv; ++j) M[j * dk + i] *= std::exp(gate);
      }
      for (int64_t j = 0; j < dv; ++j) {
        double mk = 0;
        for (int64_t i = 0; i < dk; ++i) mk += M[j * dk + i] * k[kh * dk + i];
        const double d = (v[h * dv + j] - mk) * b;
        double mq = 0;
        for (int64_t i = 0; i < dk; ++i) M[j * dk + i] += d * k[kh * dk + i];
        for (int64_t i = 0; i < dk; ++i) mq += M[j * dk + i] * q[kh * dk + i];
        out[h * dv + j] = mq / std::sqrt(double(dk));
      }
    }
    return out;
  }
};

std::vector<double> row(const std::vector<float>& v, int64_t t, int64_t n) {
  return {v.begin() + t * n, v.begin() + (t + 1) * n};
}

}  // namespace

TEST(DeltaRule, CpuMatchesTheDefinitionInFloat64) {
  for (const auto& c : expertd::test::delta_classes()) {
    SCOPED_TRACE(c.name);
    DeltaOpts o = c.opts(4);
    const int64_t Dq = c.hk * c.dk, Dv = c.hv * c.dv, G = o.gate_width(), Hv = c.hv;
    const auto cq = normal(size_t(4 * Dq), 1, 0.5f), ck = normal(size_t(4 * Dq), 2, 0.5f),
               cv = normal(size_t(4 * Dv), 3, 0.5f),
               av = normal(size_t(Hv), 4, 0.3f, c.a_positive ? 1.0f : -1.0f);
    o.conv_q = f32(cq, 4, Dq), o.conv_k = f32(ck, 4, Dq), o.conv_v = f32(cv, 4, Dv);
    o.a = f32(av, Hv, 1);
    auto ops = engine::make_cpu_ops(2);
    ops->init_cache({engine::KvRows{0, 0, o.state_floats(), 0}}, 16, 1, engine::KvType::F32);
    Reference ref(o, cq, ck, cv, av);
    double worst = 0, mag = 0;
    int64_t pos = 0;
    for (int64_t T : {5, 1}) {
      const std::vector<engine::SeqRows> seq = {{0, 0, T, pos}};
      ops->begin_eval(seq);
      const uint32_t s = 10 + uint32_t(pos);
      const auto q = normal(size_t(T * Dq), s), k = normal(size_t(T * Dq), s + 1),
                 v = normal(size_t(T * Dv), s + 2), g = normal(size_t(T * Hv * G), s + 3),
                 b = normal(size_t(T * Hv), s + 4);
      auto act = [&](const std::vector<float>& x, int64_t cols) {
        Act y = ops->alloc(T, cols);
        std::copy(x.begin(), x.end(), y.data);
        return y;
      };
      Act aq = act(q, Dq), ak = act(k, Dq), avv = act(v, Dv), ag = act(g, Hv * G), ab = act(b, Hv),
          y = ops->alloc(T, Dv);
      ops->delta_rule(0, o, aq, ak, avv, ag, ab, y);
      for (int64_t t = 0; t < T; ++t) {
        const auto want =
            ref.step(row(q, t, Dq), row(k, t, Dq), row(v, t, Dv), row(g, t, Hv * G), row(b, t, Hv));
        for (int64_t j = 0; j < Dv; ++j)
          worst = std::max(worst, std::fabs(double(y.row(t)[j]) - want[size_t(j)])),
          mag = std::max(mag, std::fabs(want[size_t(j)]));
      }
      pos += T;
    }
    EXPECT_GT(mag, 0.05) << "outputs all near zero: the comparison would say nothing";
    EXPECT_LE(worst, 1e-5 * std::max(1.0, mag)) << "largest |float - float64| " << worst;
  }
}

// ggml's norm: (x - mean) / sqrt(variance + eps), then the weight and the bias.
TEST(CpuOps, LayerNormIsTheDefinition) {
  auto ops = engine::make_cpu_ops(1);
  const int64_t n = 48;
  const auto x = normal(size_t(2 * n), 7, 3.0f, 2.0f), w = normal(size_t(n), 8, 0.5f, 1.0f),
             b = normal(size_t(n), 9);
  Act a = ops->alloc(2, n), y = ops->alloc(2, n);
  std::copy(x.begin(), x.end(), a.data);
  ops->layer_norm(a, f32(w, n, 1), f32(b, n, 1), y, 1e-5f);
  double worst = 0;
  for (int64_t t = 0; t < 2; ++t) {
    double mean = 0, var = 0;
    for (int64_t i = 0; i < n; ++i) mean += x[size_t(t * n + i)] / double(n);
    for (int64_t i = 0; i < n; ++i) var += std::pow(x[size_t(t * n + i)] - mean, 2) / double(n);
    for (int64_t i = 0; i < n; ++i) {
      const double want =
          (x[size_t(t * n + i)] - mean) / std::sqrt(var + 1e-5) * w[size_t(i)] + b[size_t(i)];
      worst = std::max(worst, std::fabs(want - y.row(t)[i]));
    }
  }
  EXPECT_LE(worst, 1e-5);
}

// top_k: each row's k largest in descending order; ties as std::partial_sort leaves them (ggml's
// CPU top_k: the same call on the same order); -inf never chosen (-1 in its place, and past the
// row's columns).
TEST(CpuOps, TopKIsTheDefinition) {
  auto ops = engine::make_cpu_ops(2);
  const int64_t T = 3, N = 37;
  std::vector<float> x(size_t(T * N));
  std::mt19937 rng(7);
  for (size_t j = 0; j < x.size(); ++j)  // row 0 distinct values, row 1 ties, row 2 mostly -inf
    x[j] = j < N       ? float(rng() % 100000) / 7.0f
           : j < 2 * N ? float(rng() % 4)
                       : (j % 9 == 0 ? float(j) : -INFINITY);
  Act a = ops->alloc(T, N);
  std::copy(x.begin(), x.end(), a.data);
  for (int k : {1, 5, 20, 40}) {
    SCOPED_TRACE(k);
    Act ids = ops->alloc(T, k);
    ops->top_k(a, k, ids);
    ASSERT_TRUE(ops->status());
    for (int64_t t = 0; t < T; ++t) {
      const float* r = &x[size_t(t * N)];
      std::vector<int32_t> order(N);
      std::iota(order.begin(), order.end(), 0);
      const int m = std::min<int>(k, N);
      std::partial_sort(order.begin(), order.begin() + m, order.end(),
                        [&](int32_t p, int32_t q) { return r[p] > r[q]; });
      for (int j = 0; j < k; ++j) {
        const int32_t got = ids.i32()[t * k + j];
        const int32_t want = j < m && r[order[j]] != -INFINITY ? order[j] : -1;
        EXPECT_EQ(got, want) << "row " << t << " place " << j;
        if (got >= 0 && j > 0 && ids.i32()[t * k + j - 1] >= 0) {
          EXPECT_GE(r[ids.i32()[t * k + j - 1]], r[got]);  // descending
        }
      }
    }
  }
  // Row 2 holds 4 finite values (at columns 7, 16, 25, 34, growing): k = 20 gives them largest
  // first, then -1s.
  Act ids = ops->alloc(T, 20);
  ops->top_k(a, 20, ids);
  const int32_t* r2 = ids.i32() + 2 * 20;
  EXPECT_EQ(std::vector<int32_t>(r2, r2 + 6), (std::vector<int32_t>{34, 25, 16, 7, -1, -1}));
}
