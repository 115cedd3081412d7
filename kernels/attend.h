// Attention of G queries over one head's keys and values (kernels::attend, attend_f16,
// attend_group, attend_group_f16: G = 1 for one query), written once over an instruction set's dot
// and values pass and the cache's element type (float, or F16 as uint16_t); kernels.cpp
// instantiates it with ref.cpp's and avx2.cpp's bodies.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace kernels {

// G queries (q + g * q_stride: the query heads that share one KV head, or MLA's heads over the
// shared latent rows) against the same keys and values: each key and value row is read once for
// all of them instead of once per query (the caches are streamed from memory G times fewer), and
// each query's result is what it would be alone, bit for bit: the same dot per key, the same
// softmax, the same additions in the same order. sinks: G logits or null; s: G * n_keys floats.
// Dots: every query's scaled dot with every key (each one dot_f32's bits); Softmax: softmax.h's
// over one query's scores; WSum: each query's out += w_j v_j for j in order, each step what
// axpy(w_j, v_j, out) does (so that a body may keep out in registers across the keys and still give
// axpy's bits).
template <typename Elem,
          void (*Dots)(const float*, int64_t, int, const Elem*, int64_t, int64_t, int64_t, float,
                       float*),
          void (*WSum)(const float*, int64_t, int, const Elem*, int64_t, int64_t, float*, int64_t,
                       int64_t),
          void (*Softmax)(float*, int64_t, float)>
void attend_group_with(const float* q, int64_t q_stride, int G, const Elem* k, const Elem* v,
                       int64_t n_keys, int64_t k_stride, int64_t v_stride, int64_t dk, int64_t dv,
                       float scale, const float* sinks, float* s, float* out, int64_t out_stride) {
  Dots(q, q_stride, G, k, n_keys, k_stride, dk, scale, s);
  for (int g = 0; g < G; ++g) {
    Softmax(s + g * n_keys, n_keys, sinks ? sinks[g] : -INFINITY);
    for (int64_t i = 0; i < dv; ++i) out[g * out_stride + i] = 0.0f;
  }
  // The values in blocks of keys small enough to stay in the first-level cache (16 KiB) while
  // every query takes its share; the sum's order is the keys' whatever the block.
  const int64_t kBlock = std::max<int64_t>(8, (int64_t{16} << 10) / (dv * int64_t(sizeof(Elem))));
  for (int64_t j0 = 0; j0 < n_keys; j0 += kBlock)
    WSum(s + j0, n_keys, G, v + j0 * v_stride, std::min(kBlock, n_keys - j0), v_stride, out,
         out_stride, dv);
}

}  // namespace kernels
