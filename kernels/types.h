// The weight-type table, as ggml's type_traits: one row per GGML type id. Every type a GGUF may
// hold has its name and block layout (the GGUF reader and the pack builder read those); a type
// the kernels run also has the activation type its dots quantize to, its dequantizer, its dot per
// instruction set, its tile, and whether the CUDA kernels run it. Adding a weight type: its block
// (quant_blocks.h), its dequantizer and dots (ref.cpp, and SIMD files where they pay), one row
// in types.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace kernels {

enum Type : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
  MXFP4 = 39,
  NVFP4 = 40,
  Q1_0 = 41,
  Q2_0 = 42,
};

enum class Isa { Scalar, Avx2, Avx512 };  // Avx512: F, BW, VL and VNNI
inline constexpr int kIsas = 3;

using DequantizeFn = void (*)(const void* src, float* dst, int64_t n);
using QuantizeFn = void (*)(const float* src, void* dst, int64_t n);
using DotFn = float (*)(const void* w, const void* x, int64_t n);
using TileFn = void (*)(const void* w, const void* const* xs, int n_tok, int64_t n, float* out);

struct TypeTraits {
  uint32_t id;
  const char* name;
  uint32_t block_elems, block_bytes;
  // The kernels' part (null where the kernels do not run the type).
  uint32_t vec_dot_type = 0;          // the activations' type in its dots
  DequantizeFn dequantize = nullptr;  // the reference
  QuantizeFn quantize[kIsas] = {};    // into this type (the activation types), per ISA, filled down
  DotFn dot[kIsas] = {};              // per ISA; filled down (a missing one is the next lower's)
  TileFn tile[kIsas] = {};            // one row x up to kMaxTile tokens; null: a dot per token
  bool cuda = false;                  // the CUDA kernels run it
};

// nullptr for an id ggml does not define (or that this build does not know).
const TypeTraits* type_traits(uint32_t id);
const TypeTraits* type_by_name(std::string_view name);  // "Q4_K", "q4_k", ...
std::string supported_type_names();                     // the weight types the kernels run
std::string cuda_type_names();                          // those the CUDA kernels run

}  // namespace kernels
