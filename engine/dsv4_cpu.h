// DeepSeek-V4's arithmetic on the CPU backend (engine/cpu_ops.cpp): the hyper-connections'
// post weights and Sinkhorn-normalised combination of one token, and the compressors that fold
// a block of positions' rows into one cache entry. Their caches' rows in F32 or F16.
#pragma once

#include <algorithm>
#include <cstdint>

#include "engine/ops.h"
#include "kernels/kernels.h"

namespace engine::dsv4 {

// A compressor's place in a layer's cache: its pending rows (kv, then scores, `width` floats
// each) in the state, its entries (`dim` values each) in the kv_state.
template <typename E>
struct Pool {
  float *kv = nullptr, *score = nullptr;
  E* entries = nullptr;
  int64_t slots = 0, width = 0, dim = 0;
};
inline void widen(const float* x, float* y, int64_t n) {
  std::copy_n(x, n, y);
}
inline void widen(const uint16_t* x, float* y, int64_t n) {
  kernels::from_f16(x, y, n);
}
inline void narrow(const float* x, float* y, int64_t n) {
  std::copy_n(x, n, y);
}
inline void narrow(const float* x, uint16_t* y, int64_t n) {
  kernels::to_f16(x, y, n);
}
// A row of the cache as floats: itself, or widened into tmp.
inline const float* row_of(const float* x, float*, int64_t) {
  return x;
}
inline const float* row_of(const uint16_t* x, float* tmp, int64_t n) {
  kernels::from_f16(x, tmp, n);
  return tmp;
}

// Post weights and the Sinkhorn-normalised combination of one token's mixes (ggml's fused
// dsv4_hc_comb: a softmax over dst per src plus eps, columns then rows and columns again).
void hc_weights(const float* m, const HcOpts& o, float* pc);

// Position p's compressor row (kv, score) into its pending ring; at the end of a block of
// o.ratio positions, the block's entry: a softmax over the positions (two blocks where the rows
// overlap) per channel, normalised and rotated as llama.cpp's dsv4 compressor does.
template <typename E>
void compress(Pool<E>& c, const Dsv4AttnOpts& o, const Tensor& ape, const Tensor& norm,
              const float* kv, const float* score, int64_t p);

}  // namespace engine::dsv4
