// The ggml tensor types a GGUF file may hold. Values match ggml.h (GGML_TYPE_*); ids with no entry
// in the weight-type table are rejected as unknown.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "kernels/types.h"

namespace gguf {

enum class GgmlType : uint32_t {
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
};

// The layout part of the kernels' weight-type table (kernels/types.h): id, name, block size and
// bytes.
using TypeTraits = kernels::TypeTraits;
// nullptr for an id ggml does not define (or that this build does not know).
inline const TypeTraits* type_traits(uint32_t id) {
  return kernels::type_traits(id);
}
std::optional<GgmlType> type_from_name(std::string_view name);  // "Q4_K", "q4_k", ...

// Bytes of one row of `elems` elements; nullopt when elems is not a whole number of blocks.
std::optional<uint64_t> row_bytes(GgmlType t, uint64_t elems);

}  // namespace gguf
