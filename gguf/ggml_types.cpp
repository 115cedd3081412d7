#include "gguf/ggml_types.h"

namespace gguf {

std::optional<GgmlType> type_from_name(std::string_view name) {
  const TypeTraits* t = kernels::type_by_name(name);
  if (!t) return std::nullopt;
  return static_cast<GgmlType>(t->id);
}

std::optional<uint64_t> row_bytes(GgmlType t, uint64_t elems) {
  const TypeTraits* tr = type_traits(static_cast<uint32_t>(t));
  if (!tr || elems % tr->block_elems != 0) return std::nullopt;
  return elems / tr->block_elems * tr->block_bytes;
}

}  // namespace gguf
