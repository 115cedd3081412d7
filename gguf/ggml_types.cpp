#include "gguf/ggml_types.h"

#include <array>
#include <cctype>

namespace gguf {
namespace {

constexpr std::array kTraits = {
    TypeTraits{GgmlType::F32, "F32", 1, 4},        TypeTraits{GgmlType::F16, "F16", 1, 2},
    TypeTraits{GgmlType::Q4_0, "Q4_0", 32, 18},    TypeTraits{GgmlType::Q4_1, "Q4_1", 32, 20},
    TypeTraits{GgmlType::Q5_0, "Q5_0", 32, 22},    TypeTraits{GgmlType::Q5_1, "Q5_1", 32, 24},
    TypeTraits{GgmlType::Q8_0, "Q8_0", 32, 34},    TypeTraits{GgmlType::Q8_1, "Q8_1", 32, 36},
    TypeTraits{GgmlType::Q2_K, "Q2_K", 256, 84},   TypeTraits{GgmlType::Q3_K, "Q3_K", 256, 110},
    TypeTraits{GgmlType::Q4_K, "Q4_K", 256, 144},  TypeTraits{GgmlType::Q5_K, "Q5_K", 256, 176},
    TypeTraits{GgmlType::Q6_K, "Q6_K", 256, 210},  TypeTraits{GgmlType::Q8_K, "Q8_K", 256, 292},
    TypeTraits{GgmlType::IQ2_XXS, "IQ2_XXS", 256, 66},
    TypeTraits{GgmlType::IQ2_XS, "IQ2_XS", 256, 74},
    TypeTraits{GgmlType::IQ3_XXS, "IQ3_XXS", 256, 98},
    TypeTraits{GgmlType::IQ1_S, "IQ1_S", 256, 50}, TypeTraits{GgmlType::IQ4_NL, "IQ4_NL", 32, 18},
    TypeTraits{GgmlType::IQ3_S, "IQ3_S", 256, 110}, TypeTraits{GgmlType::IQ2_S, "IQ2_S", 256, 82},
    TypeTraits{GgmlType::IQ4_XS, "IQ4_XS", 256, 136}, TypeTraits{GgmlType::I8, "I8", 1, 1},
    TypeTraits{GgmlType::I16, "I16", 1, 2},        TypeTraits{GgmlType::I32, "I32", 1, 4},
    TypeTraits{GgmlType::I64, "I64", 1, 8},        TypeTraits{GgmlType::F64, "F64", 1, 8},
    TypeTraits{GgmlType::IQ1_M, "IQ1_M", 256, 56}, TypeTraits{GgmlType::BF16, "BF16", 1, 2},
    TypeTraits{GgmlType::TQ1_0, "TQ1_0", 256, 54}, TypeTraits{GgmlType::TQ2_0, "TQ2_0", 256, 66},
    TypeTraits{GgmlType::MXFP4, "MXFP4", 32, 17},
};

}  // namespace

const TypeTraits* type_traits(uint32_t id) {
  for (const auto& t : kTraits)
    if (static_cast<uint32_t>(t.type) == id) return &t;
  return nullptr;
}

std::optional<GgmlType> type_from_name(std::string_view name) {
  for (const auto& t : kTraits) {
    if (t.name.size() != name.size()) continue;
    bool eq = true;
    for (size_t i = 0; i < name.size() && eq; ++i)
      eq = std::toupper(static_cast<unsigned char>(name[i])) == t.name[i];
    if (eq) return t.type;
  }
  return std::nullopt;
}

std::optional<uint64_t> row_bytes(GgmlType t, uint64_t elems) {
  const TypeTraits* tr = type_traits(static_cast<uint32_t>(t));
  if (!tr || elems % tr->block_elems != 0) return std::nullopt;
  return elems / tr->block_elems * tr->block_bytes;
}

}  // namespace gguf
