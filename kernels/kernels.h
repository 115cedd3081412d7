// CPU kernels for MoE inference. Weight types use GGML's ids and are rows of one table
// (kernels/types.h). Every op has a scalar reference (ref.cpp, the source of truth) and AVX2 and
// AVX-512 VNNI bodies where they pay (avx2.cpp, avx512.cpp); the best the CPU runs is chosen at
// run time (EXPERTD_KERNELS=avx2|scalar lowers the choice).
// Before a quantized matmul the activations are quantized the way llama.cpp's CPU path does
// (F16 for F16 weights, BF16 for BF16, Q8_0 blocks for Q8_0, Q8_K blocks for K-quants).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/thread_pool.h"
#include "kernels/types.h"

namespace kernels {

inline constexpr int kMaxTile = 4;  // tokens per weight-row pass in a matmul

Isa best_isa();  // what this CPU runs
const char* isa_name(Isa b);

bool weight_type_supported(uint32_t type);  // the kernels run it (its table row has dots)
uint32_t vec_dot_type(uint32_t wtype);      // activation type for dots with `wtype`
size_t row_size(uint32_t type, int64_t n);  // bytes of n elements (n a multiple of the block)

void dequantize_row(uint32_t type, const void* src, float* dst, int64_t n);
// Quantizes activations to vec_dot_type(wtype); dst holds row_size(vec_dot_type, n) bytes.
void quantize_activations(uint32_t wtype, const float* x, void* dst, int64_t n, Isa b = best_isa());
float dot(uint32_t wtype, const void* wrow, const void* xq, int64_t n, Isa b = best_isa());
// One weight row against n_tok (1..kMaxTile) quantized activation rows; out[t] is bit-identical to
// dot(wtype, wrow, xs[t], n, b) whatever n_tok is.
void dot_tile(uint32_t wtype, const void* wrow, const void* const* xs, int n_tok, int64_t n,
              float* out, Isa b = best_isa());

// y[t*rows + r] = sum_c W[r, c] * x[t*cols + c] for t < n_tokens. W is rows x cols, row-major in
// `wtype`. `scratch` is resized as needed (activations quantized once per call).
struct Scratch {
  uint8_t* data = nullptr;
  size_t bytes = 0;
  ~Scratch();
  uint8_t* get(size_t n);
};
// w8: the same matrix interleaved (rows8_pack), or null.
void matmul(uint32_t wtype, const void* w, int64_t rows, int64_t cols, const float* x,
            int64_t n_tokens, float* y, Scratch& scratch, ThreadPool* pool, Isa b = best_isa(),
            const void* w8 = nullptr);

// Weights interleaved eight rows at a time (kernels/rows8.h): a copy of a matrix whose
// matrix-vector product (decode, and any job too small for a matrix-matrix panel) reads eight rows
// in the lanes of one register, for the types with such a body (rows8_type_names()). It gives the
// rows' bits: a job's w8 is an addition to its w, which the panels and the scalar reference still
// read.
bool rows8_supported(uint32_t wtype);
std::string rows8_type_names();  // those types, for help texts ("Q4_0, Q4_1, ...")
size_t rows8_bytes(uint32_t wtype, int64_t rows, int64_t cols);  // rows % 8 == 0, cols % 256 == 0
void rows8_pack(uint32_t wtype, const void* w, int64_t rows, int64_t cols, void* out,
                ThreadPool* pool = nullptr);
// The inverse: the rows, byte for byte, from their interleaved copy (out: rows x row_size bytes).
void rows8_unpack(uint32_t wtype, const void* w8, int64_t rows, int64_t cols, void* out,
                  ThreadPool* pool = nullptr);
// Group g (rows 8g .. 8g + 7) of w8 against n_tok (1..kMaxTile) quantized activation rows: out[t
// * 8 + r] is bit for bit dot(wtype, row 8g + r, xs[t], cols) on the SIMD instruction sets (b:
// AVX2 or AVX-512 VNNI, whose bodies give the same bits).
void rows8_group(uint32_t wtype, const void* w8, int64_t cols, int64_t g, const void* const* xs,
                 int n_tok, float* out, Isa b = best_isa());

// One weight matrix against already-quantized activation rows: token i's row is
// xq + tok[i] * xq_row (tok == nullptr: row i). y[i * rows + r] receives row r's dot.
struct MatmulJob {
  uint32_t wtype;
  const void* w;
  int64_t rows, cols;
  const uint8_t* xq;
  size_t xq_row;
  const int32_t* tok;
  int64_t n_tokens;
  float* y;
  const void* w8 = nullptr;  // the same matrix interleaved (rows8_pack; rows % 8 == 0), or null
};
// A job may have w8 alone (w null: an expert from a pack that stores the interleaved layout,
// expert-pack build --layout rows8): where the loop needs the rows (a matrix-matrix panel, the
// scalar reference) it unpacks them into scratch of its own (the panels' eight groups at a time,
// kept in L2).
// Runs every job in one parallel loop over all their rows (one fork-join however many matrices:
// a decode step's experts are many small matrices). Each y value is exactly what matmul() gives.
void matmul_batch(const MatmulJob* jobs, size_t n_jobs, ThreadPool* pool, Isa b = best_isa());

// Elementwise and small ops (float32).
float dot_f32(const float* a, const float* b, int64_t n, Isa be = best_isa());
void axpy(float a, const float* x, float* y, int64_t n, Isa be = best_isa());  // y += a * x
// The same in ggml's order on SIMD backends (ggml_vec_dot_f32 / ggml_vec_mad_f32 as llama.cpp's
// AVX2 build runs them), for ops whose bits should be llama.cpp's (the KDA recurrence).
float dot_f32_ggml(const float* a, const float* b, int64_t n, Isa be = best_isa());
void axpy_ggml(float a, const float* x, float* y, int64_t n, Isa be = best_isa());
// One attention head for one query: softmax(q . k_j * scale) over n_keys keys (dk floats each,
// k_j = k + j * k_stride), then the weighted sum of the v_j (dv floats, v + j * v_stride). A finite
// `sink` is one more logit in the softmax's denominator (gpt-oss); -INFINITY for none. `s` holds
// n_keys floats of scratch.
void attend(const float* q, const float* k, const float* v, int64_t n_keys, int64_t k_stride,
            int64_t v_stride, int64_t dk, int64_t dv, float scale, float sink, float* s, float* out,
            Isa be = best_isa());
// attend over F16 keys and values (k, v and the strides in uint16_t elements); the same result as
// attend over the rows widened to float.
void attend_f16(const float* q, const uint16_t* k, const uint16_t* v, int64_t n_keys,
                int64_t k_stride, int64_t v_stride, int64_t dk, int64_t dv, float scale, float sink,
                float* s, float* out, Isa be = best_isa());
// attend for G queries (q + g * q_stride) over the same keys and values, each key and value row
// read once for all of them (the query heads that share a KV head): out + g * out_stride gets
// query g's result, bit for bit attend's for it alone. sinks: G logits or null; s: G * n_keys
// floats of scratch.
void attend_group(const float* q, int64_t q_stride, int G, const float* k, const float* v,
                  int64_t n_keys, int64_t k_stride, int64_t v_stride, int64_t dk, int64_t dv,
                  float scale, const float* sinks, float* s, float* out, int64_t out_stride,
                  Isa be = best_isa());
void attend_group_f16(const float* q, int64_t q_stride, int G, const uint16_t* k, const uint16_t* v,
                      int64_t n_keys, int64_t k_stride, int64_t v_stride, int64_t dk, int64_t dv,
                      float scale, const float* sinks, float* s, float* out, int64_t out_stride,
                      Isa be = best_isa());
// attend's softmax of n scores in place, `sink` one more logit in its denominator (-INFINITY:
// none): softmax.h's steps (its own exp, within ~1 ulp of exp; sums in double), the same bits on
// every instruction set.
void attention_softmax(float* s, int64_t n, float sink, Isa be = best_isa());
// Rows of floats to F16 and back (round to nearest even; exact widening).
void to_f16(const float* x, uint16_t* y, int64_t n);
void from_f16(const uint16_t* x, float* y, int64_t n);
void rms_norm(const float* x, const float* w, float* y, int64_t n, float eps);
// Rotates pairs of one head of head_dim values at position pos: NeoX pairs (i, i+n_rot/2) or
// normal adjacent pairs (2i, 2i+1); only the first n_rot dims.
// YaRN context extension (llama.cpp's ggml_rope_yarn): freq_scale = 1/factor, ext_factor 1,
// correction dims from beta_fast/beta_slow; cos and sin scaled by mscale (1 + 0.1 ln factor).
struct Yarn {
  float freq_scale = 1.0f, ext_factor = 0.0f, corr_low = 0.0f, corr_high = 0.0f, mscale = 1.0f;
};
Yarn yarn_params(float factor, int64_t n_rot, float base, int64_t n_ctx_orig,
                 float beta_fast = 32.0f, float beta_slow = 1.0f);
// inverse: rotate by -theta (ggml's rope_back); freq_factors (n_rot / 2, may be null): pair i's
// angle divided by freq_factors[i] before YaRN (ggml's rope factors, llama3-style scaling).
void rope(float* x, int64_t head_dim, int64_t n_rot, int64_t pos, float base, bool neox,
          const Yarn* yarn = nullptr, bool inverse = false, const float* freq_factors = nullptr);
void softmax(float* x, int64_t n);
float silu(float x);
// SwiGLU over n values: out[i] = silu(g[i]) * u[i] with softmax.h's exp (within ~1 ulp of exp;
// silu above keeps the C library's), the same bits on every instruction set; out may be g or u.
void swiglu(const float* g, const float* u, float* out, int64_t n, Isa be = best_isa());

}  // namespace kernels
