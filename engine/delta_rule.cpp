#include "engine/delta_rule.h"

#include <cmath>
#include <vector>

#include "engine/activation.h"

namespace engine {

void delta_rule_cpu(const DeltaOpts& o, Act q, Act k, Act v, Act g, Act beta, float* state, Act out,
                    kernels::ThreadPool& pool, kernels::Isa be) {
  const int64_t Hk = o.n_k_head, Hv = o.n_v_head, dk = o.dk, dv = o.dv, C = o.d_conv - 1,
                T = q.rows, G = o.gate_width();
  const Tensor* conv_w[3] = {&o.conv_q, &o.conv_k, &o.conv_v};
  Act xs[3] = {q, k, v};
  float* window = state;  // per input: [channel][C] oldest first
  for (int m = 0; m < 3; ++m) {
    const int64_t D = xs[m].cols;
    const float* w = conv_w[m]->f32();
    pool.parallel_for(D, 64, [&](int64_t b, int64_t e) {
      for (int64_t c = b; c < e; ++c) {
        float* win = window + c * C;
        for (int64_t t = 0; t < T; ++t) {
          const float x = xs[m].row(t)[c];
          float sum = 0;
          for (int64_t j = 0; j < C; ++j) sum += win[j] * w[c * (C + 1) + j];
          sum += x * w[c * (C + 1) + C];
          for (int64_t j = 0; j + 1 < C; ++j) win[j] = win[j + 1];
          if (C > 0) win[C - 1] = x;
          xs[m].row(t)[c] = kernels::silu(sum);
        }
      }
    });
    window += C * D;
  }
  const float inv_sqrt_dk = 1.0f / std::sqrt(float(dk));
  auto l2 = [&](float* x) {  // ggml: rms_norm with eps / dk (a double sum), then 1 / sqrt(dk)
    double ss = 0;
    for (int64_t i = 0; i < dk; ++i) ss += double(x[i] * x[i]);
    const float sc = 1.0f / std::sqrt(float(ss / double(dk)) + o.eps / float(dk));
    for (int64_t i = 0; i < dk; ++i) x[i] = x[i] * sc * inv_sqrt_dk;
  };
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < Hk; ++h) l2(q.row(t) + h * dk), l2(k.row(t) + h * dk);
    for (int64_t h = 0; h < Hv; ++h) {
      const float a = o.a.f32()[h];
      float* gt = g.row(t) + h * G;
      for (int64_t i = 0; i < G; ++i)
        gt[i] = std::isfinite(o.lower_bound)
                    ? sigmoid(o.a_positive ? gt[i] * a : -(gt[i] * a)) * o.lower_bound
                    : (gt[i] > 20.0f ? gt[i] : std::log(1.0f + std::exp(gt[i]))) * a;
      beta.row(t)[h] = sigmoid(beta.row(t)[h]);
    }
  }
  float* states = window;
  pool.parallel_for(Hv, 1, [&](int64_t b, int64_t e) {
    std::vector<float> decay(dk), delta(dv);
    for (int64_t h = b; h < e; ++h) {
      const int64_t kh = o.key_head(h);
      float* M = states + h * dk * dv;  // M[j][i] = S[i][j]: row j is value j's column
      for (int64_t t = 0; t < T; ++t) {
        const float *qt = q.row(t) + kh * dk, *kt = k.row(t) + kh * dk, *vt = v.row(t) + h * dv,
                    *gt = g.row(t) + h * G;
        const float bt = beta.row(t)[h];
        float* ot = out.row(t) + h * dv;
        // ggml's order of operations, so the state keeps llama.cpp's bits
        for (int64_t i = 0; i < dk; ++i) decay[i] = std::exp(gt[G == 1 ? 0 : i]);
        for (int64_t j = 0; j < dv; ++j)
          for (int64_t i = 0; i < dk; ++i) M[j * dk + i] *= decay[i];
        for (int64_t j = 0; j < dv; ++j)
          delta[j] = (vt[j] - kernels::dot_f32_ggml(M + j * dk, kt, dk, be)) * bt;
        for (int64_t j = 0; j < dv; ++j) kernels::axpy_ggml(delta[j], kt, M + j * dk, dk, be);
        for (int64_t j = 0; j < dv; ++j)
          ot[j] = kernels::dot_f32_ggml(M + j * dk, qt, dk, be) * inv_sqrt_dk;
      }
    }
  });
}

}  // namespace engine
