// The kernel bodies of each instruction set (internal to kernels/): the scalar reference
// (ref.cpp), AVX2 (avx2.cpp, avx2_quants.cpp) and AVX-512 VNNI (avx512.cpp). The weight-type table
// (types.cpp) points at them; an instruction set without a body for a type runs the next
// lower one's (AVX-512 -> AVX2 -> reference).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/quant_blocks.h"

namespace kernels {

// AMD's family 19h (Zen 3, Zen 4): a 512-bit instruction runs as two 256-bit halves, so AVX-512
// bodies gain nothing over AVX2's width and some run slower (types.cpp, kernels.cpp).
bool halves_512();
// Whether the AVX-512 bodies should look grid rows up one at a time instead of gathering them:
// where the kernel reports a microcode mitigation of Gather Data Sampling (Intel's Skylake to Ice
// Lake and Tiger Lake), which makes vpgather several times slower. EXPERTD_GATHER=0 says yes, 1 or
// loads no (tests run every path).
bool gathers_slow();
// Whether the AVX-512 grid bodies that gather 8-byte rows (IQ1_S, IQ1_M, IQ2_XS, IQ2_S) fetch a
// step's rows by loads from the stored indices instead of one vpgatherqq (grid_rows512.h), and
// AVX2's IQ3_XXS looks its rows up one at a time instead of by vpgatherdd: on AMD's family 19h,
// where on a Zen 4 the loads read those types 7-12% faster and IQ3_XXS's lookups 1.2x (2 threads,
// from memory). EXPERTD_GATHER=loads says yes, EXPERTD_GATHER=0 or 1 no.
bool gathers_by_loads();

namespace ref {
void quantize_f32(const float* x, float* y, int64_t n);
void quantize_f16(const float* x, uint16_t* y, int64_t n);
void quantize_bf16(const float* x, uint16_t* y, int64_t n);
void quantize_q8_0(const float* x, BlockQ8_0* y, int64_t n);
void quantize_q8_k(const float* x, BlockQ8K* y, int64_t n);
float dot_f32(const float* a, const float* b, int64_t n);
void axpy(float a, const float* x, float* y, int64_t n);
// dot_f32 and axpy over F16 values (a --kv-type f16 cache): each element widened exactly, then
// the same F32 arithmetic in the same order. wsum: out += w_j v_j over n rows, j in order, each
// step axpy's (attention's values pass; attend.h).
float dot_f32_f16(const float* a, const uint16_t* b, int64_t n);
// (G queries: w + g * w_stride, out + g * out_stride.)
void wsum_f32(const float* w, int64_t w_stride, int G, const float* v, int64_t n, int64_t stride,
              float* out, int64_t out_stride, int64_t dv);
void wsum_f16(const float* w, int64_t w_stride, int G, const uint16_t* v, int64_t n, int64_t stride,
              float* out, int64_t out_stride, int64_t dv);
// Attention's scores: s[g * n_keys + j] = dot(q + g * q_stride, k + j * k_stride, dk) * scale for
// G queries and n_keys keys, each pair's dot that of dot_f32 (dot_f32_f16) bit for bit.
void dots_f32(const float* q, int64_t q_stride, int G, const float* k, int64_t n_keys,
              int64_t k_stride, int64_t dk, float scale, float* s);
void dots_f16(const float* q, int64_t q_stride, int G, const uint16_t* k, int64_t n_keys,
              int64_t k_stride, int64_t dk, float scale, float* s);
// Attention's softmax of n scores in place, a sink's logit beside them (-INFINITY: none); the
// steps softmax.h defines, the same bits on every instruction set.
void softmax_scores(float* s, int64_t n, float sink);
// SwiGLU: out[i] = g[i] / (1 + exp_clamped(-g[i])) * u[i] (softmax.h's exp; out may be g or u).
void swiglu(const float* g, const float* u, float* out, int64_t n);
void axpy_f16(float a, const uint16_t* x, float* y, int64_t n);
float dot_f16(const uint16_t* a, const uint16_t* b, int64_t n);
float dot_bf16(const uint16_t* a, const uint16_t* b, int64_t n);
float dot_q8_0(const BlockQ8_0* x, const BlockQ8_0* y, int64_t n);
float dot_q5_0(const BlockQ5_0* x, const BlockQ8_0* y, int64_t n);
float dot_mxfp4(const BlockMxfp4* x, const BlockQ8_0* y, int64_t n);
float dot_q4_k(const BlockQ4K* x, const BlockQ8K* y, int64_t n);
float dot_q5_k(const BlockQ5K* x, const BlockQ8K* y, int64_t n);
float dot_q6_k(const BlockQ6K* x, const BlockQ8K* y, int64_t n);
void quantize_q8_1(const float* x, BlockQ8_1* y, int64_t n);
float dot_q4_0(const BlockQ4_0* x, const BlockQ8_0* y, int64_t n);
float dot_q4_1(const BlockQ4_1* x, const BlockQ8_1* y, int64_t n);
float dot_q5_1(const BlockQ5_1* x, const BlockQ8_1* y, int64_t n);
float dot_iq4_nl(const BlockIq4Nl* x, const BlockQ8_0* y, int64_t n);
float dot_nvfp4(const BlockNvfp4* x, const BlockQ8_0* y, int64_t n);
float dot_q1_0(const BlockQ1_0* x, const BlockQ8_0* y, int64_t n);
float dot_q2_0(const BlockQ2_0* x, const BlockQ8_0* y, int64_t n);
float dot_q2_k(const BlockQ2K* x, const BlockQ8K* y, int64_t n);
float dot_q3_k(const BlockQ3K* x, const BlockQ8K* y, int64_t n);
float dot_tq1_0(const BlockTq1_0* x, const BlockQ8K* y, int64_t n);
float dot_tq2_0(const BlockTq2_0* x, const BlockQ8K* y, int64_t n);
float dot_iq2_xxs(const BlockIq2Xxs* x, const BlockQ8K* y, int64_t n);
float dot_iq2_xs(const BlockIq2Xs* x, const BlockQ8K* y, int64_t n);
float dot_iq2_s(const BlockIq2S* x, const BlockQ8K* y, int64_t n);
float dot_iq3_xxs(const BlockIq3Xxs* x, const BlockQ8K* y, int64_t n);
float dot_iq3_s(const BlockIq3S* x, const BlockQ8K* y, int64_t n);
float dot_iq1_s(const BlockIq1S* x, const BlockQ8K* y, int64_t n);
float dot_iq1_m(const BlockIq1M* x, const BlockQ8K* y, int64_t n);
float dot_iq4_xs(const BlockIq4Xs* x, const BlockQ8K* y, int64_t n);
}  // namespace ref

namespace avx2 {
// ggml's ggml_vec_dot_f32 and ggml_vec_mad_f32 on AVX2 (its four FMA accumulators of a 32-float
// step, its reduction; leftovers one at a time).
float dot_f32_ggml(const float* a, const float* b, int64_t n);
void axpy_ggml(float a, const float* x, float* y, int64_t n);
void quantize_q8_0(const float* x, BlockQ8_0* y, int64_t n);
void quantize_q8_k(const float* x, BlockQ8K* y, int64_t n);
float dot_f32(const float* a, const float* b, int64_t n);
void axpy(float a, const float* x, float* y, int64_t n);
// dot_f32 and axpy over F16 values (a --kv-type f16 cache): each element widened exactly, then
// the same F32 arithmetic in the same order. wsum: out += w_j v_j over n rows, j in order, each
// step axpy's (attention's values pass; attend.h).
float dot_f32_f16(const float* a, const uint16_t* b, int64_t n);
// (G queries: w + g * w_stride, out + g * out_stride.)
void wsum_f32(const float* w, int64_t w_stride, int G, const float* v, int64_t n, int64_t stride,
              float* out, int64_t out_stride, int64_t dv);
void wsum_f16(const float* w, int64_t w_stride, int G, const uint16_t* v, int64_t n, int64_t stride,
              float* out, int64_t out_stride, int64_t dv);
// Attention's scores: s[g * n_keys + j] = dot(q + g * q_stride, k + j * k_stride, dk) * scale for
// G queries and n_keys keys, each pair's dot that of dot_f32 (dot_f32_f16) bit for bit.
void dots_f32(const float* q, int64_t q_stride, int G, const float* k, int64_t n_keys,
              int64_t k_stride, int64_t dk, float scale, float* s);
void dots_f16(const float* q, int64_t q_stride, int G, const uint16_t* k, int64_t n_keys,
              int64_t k_stride, int64_t dk, float scale, float* s);
// Attention's softmax of n scores in place, a sink's logit beside them (-INFINITY: none); the
// steps softmax.h defines, the same bits on every instruction set.
void softmax_scores(float* s, int64_t n, float sink);
// SwiGLU: out[i] = g[i] / (1 + exp_clamped(-g[i])) * u[i] (softmax.h's exp; out may be g or u).
void swiglu(const float* g, const float* u, float* out, int64_t n);
void axpy_f16(float a, const uint16_t* x, float* y, int64_t n);
float dot_f16(const uint16_t* a, const uint16_t* b, int64_t n);
float dot_bf16(const uint16_t* a, const uint16_t* b, int64_t n);
float dot_q8_0(const BlockQ8_0* x, const BlockQ8_0* y, int64_t n);
float dot_q5_0(const BlockQ5_0* x, const BlockQ8_0* y, int64_t n);
float dot_mxfp4(const BlockMxfp4* x, const BlockQ8_0* y, int64_t n);
float dot_q4_k(const BlockQ4K* x, const BlockQ8K* y, int64_t n);
float dot_q5_k(const BlockQ5K* x, const BlockQ8K* y, int64_t n);
float dot_q6_k(const BlockQ6K* x, const BlockQ8K* y, int64_t n);
float dot_q4_0(const BlockQ4_0* x, const BlockQ8_0* y, int64_t n);
float dot_q4_1(const BlockQ4_1* x, const BlockQ8_1* y, int64_t n);
float dot_q5_1(const BlockQ5_1* x, const BlockQ8_1* y, int64_t n);
float dot_iq4_nl(const BlockIq4Nl* x, const BlockQ8_0* y, int64_t n);
float dot_q2_k(const BlockQ2K* x, const BlockQ8K* y, int64_t n);
float dot_q3_k(const BlockQ3K* x, const BlockQ8K* y, int64_t n);
float dot_iq2_xxs(const BlockIq2Xxs* x, const BlockQ8K* y, int64_t n);
float dot_iq2_xs(const BlockIq2Xs* x, const BlockQ8K* y, int64_t n);
float dot_iq2_s(const BlockIq2S* x, const BlockQ8K* y, int64_t n);
float dot_iq3_xxs(const BlockIq3Xxs* x, const BlockQ8K* y, int64_t n);
float dot_iq3_s(const BlockIq3S* x, const BlockQ8K* y, int64_t n);
float dot_iq1_s(const BlockIq1S* x, const BlockQ8K* y, int64_t n);
float dot_iq1_m(const BlockIq1M* x, const BlockQ8K* y, int64_t n);
float dot_iq4_xs(const BlockIq4Xs* x, const BlockQ8K* y, int64_t n);
float dot_q2_0(const BlockQ2_0* x, const BlockQ8_0* y, int64_t n);
float dot_q1_0(const BlockQ1_0* x, const BlockQ8_0* y, int64_t n);
float dot_tq2_0(const BlockTq2_0* x, const BlockQ8K* y, int64_t n);
float dot_nvfp4(const BlockNvfp4* x, const BlockQ8_0* y, int64_t n);
float dot_tq1_0(const BlockTq1_0* x, const BlockQ8K* y, int64_t n);
void tile_tq1_0(const BlockTq1_0* x, const BlockQ8K* const* ys, int n_tok, int64_t n, float* out);
// One weight row against n_tok (1..kMaxTile) activation rows, each token's result bit-identical
// to the dot's.
void tile_nvfp4(const BlockNvfp4* x, const BlockQ8_0* const* ys, int n_tok, int64_t n, float* out);
void tile_q2_k(const BlockQ2K* x, const BlockQ8K* const* ys, int n_tok, int64_t n, float* out);
void tile_q3_k(const BlockQ3K* x, const BlockQ8K* const* ys, int n_tok, int64_t n, float* out);
void tile_q4_k(const BlockQ4K* x, const BlockQ8K* const* ys, int n_tok, int64_t n, float* out);
void tile_q5_k(const BlockQ5K* x, const BlockQ8K* const* ys, int n_tok, int64_t n, float* out);
void tile_q6_k(const BlockQ6K* x, const BlockQ8K* const* ys, int n_tok, int64_t n, float* out);
void tile_iq2_xxs(const BlockIq2Xxs* x, const BlockQ8K* const* ys, int n_tok, int64_t n,
                  float* out);
void tile_iq4_xs(const BlockIq4Xs* x, const BlockQ8K* const* ys, int n_tok, int64_t n, float* out);
void tile_iq2_xs(const BlockIq2Xs* x, const BlockQ8K* const* ys, int n_tok, int64_t n, float* out);
void tile_iq2_s(const BlockIq2S* x, const BlockQ8K* const* ys, int n_tok, int64_t n, float* out);
void tile_iq3_xxs(const BlockIq3Xxs* x, const BlockQ8K* const* ys, int n_tok, int64_t n,
                  float* out);
void tile_iq3_s(const BlockIq3S* x, const BlockQ8K* const* ys, int n_tok, int64_t n, float* out);
void tile_iq1_s(const BlockIq1S* x, const BlockQ8K* const* ys, int n_tok, int64_t n, float* out);
void tile_iq1_m(const BlockIq1M* x, const BlockQ8K* const* ys, int n_tok, int64_t n, float* out);
void tile_q8_0(const BlockQ8_0* x, const BlockQ8_0* const* ys, int n_tok, int64_t n, float* out);
void tile_mxfp4(const BlockMxfp4* x, const BlockQ8_0* const* ys, int n_tok, int64_t n, float* out);
// avx2_gather.cpp's bodies, which the tiles above run where gathers are fast (the same bits).
void tile_iq1_s_gather(const BlockIq1S* x, const BlockQ8K* const* ys, int n_tok, int64_t n,
                       float* out);
void tile_iq1_m_gather(const BlockIq1M* x, const BlockQ8K* const* ys, int n_tok, int64_t n,
                       float* out);
void tile_iq2_s_gather(const BlockIq2S* x, const BlockQ8K* const* ys, int n_tok, int64_t n,
                       float* out);
// Matrix-matrix (gemm_avx2.cpp) for Q8_0, MXFP4, Q2_K-Q6_K, IQ2_XXS, IQ4_XS: as avx512's below.
bool gemm_supported(uint32_t wtype);
size_t gemm_act_bytes(uint32_t wtype, int64_t cols, int64_t n_tokens);
void gemm_lay_out(uint32_t wtype, const uint8_t* xq, size_t xq_row, const int32_t* tok,
                  int64_t n_tokens, int64_t cols, uint8_t* panel);
void gemm_rows(uint32_t wtype, const void* w, int64_t rows, int64_t cols, int64_t r0, int64_t r1,
               const uint8_t* panel, int64_t n_tokens, float* y);
}  // namespace avx2

namespace avx512 {
float dot_f16(const uint16_t* a, const uint16_t* b, int64_t n);
float dot_bf16(const uint16_t* a, const uint16_t* b, int64_t n);
// The activations' quantizers, quantize_acts.h's arithmetic 16 floats a step (the reference's
// bytes).
void quantize_q8_0(const float* x, BlockQ8_0* y, int64_t n);
void quantize_q8_k(const float* x, BlockQ8K* y, int64_t n);
float dot_q8_0(const BlockQ8_0* x, const BlockQ8_0* y, int64_t n);
float dot_mxfp4(const BlockMxfp4* x, const BlockQ8_0* y, int64_t n);
float dot_nvfp4(const BlockNvfp4* x, const BlockQ8_0* y, int64_t n);
// avx512_lowbit.cpp
float dot_tq1_0(const BlockTq1_0* x, const BlockQ8K* y, int64_t n);
void tile_tq1_0(const BlockTq1_0* x, const BlockQ8K* const* ys, int n_tok, int64_t n, float* out);
float dot_tq2_0(const BlockTq2_0* x, const BlockQ8K* y, int64_t n);
void tile_tq2_0(const BlockTq2_0* x, const BlockQ8K* const* ys, int n_tok, int64_t n, float* out);
float dot_q4_k(const BlockQ4K* x, const BlockQ8K* y, int64_t n);
float dot_q5_k(const BlockQ5K* x, const BlockQ8K* y, int64_t n);
float dot_q6_k(const BlockQ6K* x, const BlockQ8K* y, int64_t n);
// One weight row against n_tok (1..kMaxTile) activation rows.
void tile_nvfp4(const BlockNvfp4* x, const BlockQ8_0* const* ys, int n_tok, int64_t n, float* out);
void tile_q8_0(const BlockQ8_0* x, const BlockQ8_0* const* ys, int n_tok, int64_t n, float* out);
void tile_mxfp4(const BlockMxfp4* x, const BlockQ8_0* const* ys, int n_tok, int64_t n, float* out);
void tile_q4_k(const BlockQ4K* x, const BlockQ8K* const* ys, int n_tok, int64_t n, float* out);
void tile_q5_k(const BlockQ5K* x, const BlockQ8K* const* ys, int n_tok, int64_t n, float* out);
void tile_q6_k(const BlockQ6K* x, const BlockQ8K* const* ys, int n_tok, int64_t n, float* out);
float dot_q2_k(const BlockQ2K* x, const BlockQ8K* y, int64_t n);
float dot_q3_k(const BlockQ3K* x, const BlockQ8K* y, int64_t n);
float dot_iq2_xxs(const BlockIq2Xxs* x, const BlockQ8K* y, int64_t n);
float dot_iq4_xs(const BlockIq4Xs* x, const BlockQ8K* y, int64_t n);
void tile_q2_k(const BlockQ2K* x, const BlockQ8K* const* ys, int n_tok, int64_t n, float* out);
void tile_q3_k(const BlockQ3K* x, const BlockQ8K* const* ys, int n_tok, int64_t n, float* out);
void tile_iq2_xxs(const BlockIq2Xxs* x, const BlockQ8K* const* ys, int n_tok, int64_t n,
                  float* out);
// IQ2_XXS's body without VBMI (tile_iq2_xxs runs avx512_vbmi's where it can).
void tile_iq2_xxs_plain(const BlockIq2Xxs* x, const BlockQ8K* const* ys, int n_tok, int64_t n,
                        float* out);
void tile_iq4_xs(const BlockIq4Xs* x, const BlockQ8K* const* ys, int n_tok, int64_t n, float* out);
// Matrix-matrix (gemm_avx512.cpp): n_tokens activation rows (already quantized; row i at
// xq + tok[i] * xq_row, tok == nullptr: row i) laid out once in a panel of gemm_act_bytes, then
// weight rows [r0, r1) against all of them: y[i * rows + r]. Each value is bit for bit the tile's.
bool gemm_supported(uint32_t wtype);
size_t gemm_act_bytes(uint32_t wtype, int64_t cols, int64_t n_tokens);
void gemm_lay_out(uint32_t wtype, const uint8_t* xq, size_t xq_row, const int32_t* tok,
                  int64_t n_tokens, int64_t cols, uint8_t* panel);
void gemm_rows(uint32_t wtype, const void* w, int64_t rows, int64_t cols, int64_t r0, int64_t r1,
               const uint8_t* panel, int64_t n_tokens, float* y);
float dot_iq1_s(const BlockIq1S* x, const BlockQ8K* y, int64_t n);
float dot_iq1_m(const BlockIq1M* x, const BlockQ8K* y, int64_t n);
void tile_iq1_s(const BlockIq1S* x, const BlockQ8K* const* ys, int n_tok, int64_t n, float* out);
void tile_iq1_m(const BlockIq1M* x, const BlockQ8K* const* ys, int n_tok, int64_t n, float* out);
float dot_iq3_xxs(const BlockIq3Xxs* x, const BlockQ8K* y, int64_t n);
void tile_iq3_xxs(const BlockIq3Xxs* x, const BlockQ8K* const* ys, int n_tok, int64_t n,
                  float* out);
float dot_iq3_s(const BlockIq3S* x, const BlockQ8K* y, int64_t n);
void tile_iq3_s(const BlockIq3S* x, const BlockQ8K* const* ys, int n_tok, int64_t n, float* out);
// The IQ3 bodies of this file (tile_iq3_xxs and tile_iq3_s run avx512_vbmi's where usable and
// gathers are fast).
void tile_iq3_xxs_plain(const BlockIq3Xxs* x, const BlockQ8K* const* ys, int n_tok, int64_t n,
                        float* out);
void tile_iq3_s_plain(const BlockIq3S* x, const BlockQ8K* const* ys, int n_tok, int64_t n,
                      float* out);
// IQ2_XS and IQ2_S: avx512_vbmi's bodies where usable and gathers are fast, else AVX2's.
float dot_iq2_xs(const BlockIq2Xs* x, const BlockQ8K* y, int64_t n);
void tile_iq2_xs(const BlockIq2Xs* x, const BlockQ8K* const* ys, int n_tok, int64_t n, float* out);
float dot_iq2_s(const BlockIq2S* x, const BlockQ8K* y, int64_t n);
void tile_iq2_s(const BlockIq2S* x, const BlockQ8K* const* ys, int n_tok, int64_t n, float* out);
}  // namespace avx512

// AVX-512 bodies that also need VBMI and GFNI (avx512_vbmi.cpp): avx512's tiles above call them
// where usable(), each giving the same bits as the body it stands in for.
namespace avx512_vbmi {
bool usable();
void tile_iq2_xxs(const BlockIq2Xxs* x, const BlockQ8K* const* ys, int n_tok, int64_t n,
                  float* out);
void tile_iq3_xxs(const BlockIq3Xxs* x, const BlockQ8K* const* ys, int n_tok, int64_t n,
                  float* out);
// The grid types whose rows these gather (avx512's tiles call them where gathers are fast too).
void tile_iq2_xs(const BlockIq2Xs* x, const BlockQ8K* const* ys, int n_tok, int64_t n, float* out);
void tile_iq2_s(const BlockIq2S* x, const BlockQ8K* const* ys, int n_tok, int64_t n, float* out);
void tile_iq3_s(const BlockIq3S* x, const BlockQ8K* const* ys, int n_tok, int64_t n, float* out);
}  // namespace avx512_vbmi

}  // namespace kernels
