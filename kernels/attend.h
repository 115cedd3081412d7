// One attention head for one query (kernels::attend, kernels::attend_f16), written once over an
// instruction set's dot and axpy and the cache's element type (float, or F16 as uint16_t); ref.cpp
// and avx2.cpp instantiate it.
#pragma once

#include <cmath>
#include <cstdint>

namespace kernels {

template <typename Elem, float (*Dot)(const float*, const Elem*, int64_t),
          void (*Axpy)(float, const Elem*, float*, int64_t)>
void attend_with(const float* q, const Elem* k, const Elem* v, int64_t n_keys, int64_t k_stride,
                 int64_t v_stride, int64_t dk, int64_t dv, float scale, float sink, float* s,
                 float* out) {
  float mx = sink;  // -inf without an attention sink
  for (int64_t j = 0; j < n_keys; ++j) {
    s[j] = Dot(q, k + j * k_stride, dk) * scale;
    mx = s[j] > mx ? s[j] : mx;
  }
  double sum = sink == -INFINITY ? 0.0 : std::exp(sink - mx);
  for (int64_t j = 0; j < n_keys; ++j) {
    s[j] = std::exp(s[j] - mx);
    sum += s[j];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < dv; ++i) out[i] = 0.0f;
  for (int64_t j = 0; j < n_keys; ++j) Axpy(s[j] * inv, v + j * v_stride, out, dv);
}

}  // namespace kernels
