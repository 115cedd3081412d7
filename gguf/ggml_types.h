// The ggml tensor types a GGUF file may hold. Values match ggml.h (GGML_TYPE_*); ids with no entry
// in the weight-type table are rejected as unknown.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "kernels/types.h"

namespace gguf {

// The ids are the kernels' weight-type table's (kernels::Type, ggml.h's GGML_TYPE_*): one list.
using GgmlType = kernels::Type;

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
