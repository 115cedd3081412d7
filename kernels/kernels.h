// CPU kernels for MoE inference. Weight types use GGML's ids. Every op has a scalar reference
// (the source of truth, always built) and an AVX2 build of the same code chosen at run time.
// Before a quantized matmul the activations are quantized the way llama.cpp's CPU path does
// (F16 for F16 weights, BF16 for BF16, Q8_0 blocks for Q8_0, Q8_K blocks for K-quants).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/thread_pool.h"

namespace kernels {

enum Type : uint32_t { F32 = 0, F16 = 1, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15, BF16 = 30 };

enum class Backend { Scalar, Avx2 };
Backend best_backend();            // what this CPU runs
const char* backend_name(Backend b);

bool weight_type_supported(uint32_t type);
uint32_t vec_dot_type(uint32_t wtype);   // activation type for dots with `wtype`
size_t row_size(uint32_t type, int64_t n);  // bytes of n elements (n a multiple of the block)

void dequantize_row(uint32_t type, const void* src, float* dst, int64_t n);
// Quantizes activations to vec_dot_type(wtype); dst holds row_size(vec_dot_type, n) bytes.
void quantize_activations(uint32_t wtype, const float* x, void* dst, int64_t n, Backend b = best_backend());
float dot(uint32_t wtype, const void* wrow, const void* xq, int64_t n, Backend b = best_backend());

// y[t*rows + r] = sum_c W[r, c] * x[t*cols + c] for t < n_tokens. W is rows x cols, row-major in
// `wtype`. `scratch` is resized as needed (activations quantized once per call).
struct Scratch {
  uint8_t* data = nullptr;
  size_t bytes = 0;
  ~Scratch();
  uint8_t* get(size_t n);
};
void matmul(uint32_t wtype, const void* w, int64_t rows, int64_t cols, const float* x, int64_t n_tokens,
            float* y, Scratch& scratch, ThreadPool* pool, Backend b = best_backend());

// Elementwise and small ops (float32).
void rms_norm(const float* x, const float* w, float* y, int64_t n, float eps);
// Rotates pairs of one head of head_dim values at position pos: NeoX pairs (i, i+n_rot/2) or
// normal adjacent pairs (2i, 2i+1); only the first n_rot dims.
void rope(float* x, int64_t head_dim, int64_t n_rot, int64_t pos, float base, bool neox);
void softmax(float* x, int64_t n);
float silu(float x);

}  // namespace kernels
