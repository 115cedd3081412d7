#include "kernels/types.h"

#include <array>
#include <cctype>

#include "kernels/isa.h"

namespace kernels {
namespace {

// The table's rows take type-erased pointers; these adapt the typed kernel bodies.
template <class W, auto F>
void deq(const void* src, float* y, int64_t n) {
  F(static_cast<const W*>(src), y, n);
}
template <class X, auto F>
void quant(const float* x, void* y, int64_t n) {
  F(x, static_cast<X*>(y), n);
}
template <class W, class X, auto F>
float dot(const void* w, const void* x, int64_t n) {
  return F(static_cast<const W*>(w), static_cast<const X*>(x), n);
}
template <class W, class X, auto F>
void tile(const void* w, const void* const* xs, int n_tok, int64_t n, float* out) {
  F(static_cast<const W*>(w), reinterpret_cast<const X* const*>(xs), n_tok, n, out);
}

// A type only the GGUF reader knows: its block layout.
constexpr TypeTraits layout(uint32_t id, const char* name, uint32_t elems, uint32_t bytes) {
  return {id, name, elems, bytes};
}

// clang-format off
const std::array kTypes = {
    // id     name     block  bytes  activations  dequantizer                                quantizer (activation types)
    //        dots: scalar reference, AVX2, AVX-512                                           tiles (AVX-512)                         CUDA
    TypeTraits{F32, "F32", 1, 4, F32, deq<float, ref::dequantize_f32>, {quant<float, ref::quantize_f32>},
               {dot<float, float, ref::dot_f32>, dot<float, float, avx2::dot_f32>, dot<float, float, avx2::dot_f32>}, {}, true},
    TypeTraits{F16, "F16", 1, 2, F16, deq<uint16_t, ref::dequantize_f16>, {quant<uint16_t, ref::quantize_f16>},
               {dot<uint16_t, uint16_t, ref::dot_f16>, dot<uint16_t, uint16_t, avx2::dot_f16>, dot<uint16_t, uint16_t, avx2::dot_f16>}, {}, true},
    TypeTraits{BF16, "BF16", 1, 2, BF16, deq<uint16_t, ref::dequantize_bf16>, {quant<uint16_t, ref::quantize_bf16>},
               {dot<uint16_t, uint16_t, ref::dot_bf16>, dot<uint16_t, uint16_t, avx2::dot_bf16>, dot<uint16_t, uint16_t, avx2::dot_bf16>}, {}, true},
    TypeTraits{Q5_0, "Q5_0", 32, 22, Q8_0, deq<BlockQ5_0, ref::dequantize_q5_0>, {},
               {dot<BlockQ5_0, BlockQ8_0, ref::dot_q5_0>, dot<BlockQ5_0, BlockQ8_0, avx2::dot_q5_0>, dot<BlockQ5_0, BlockQ8_0, avx2::dot_q5_0>}, {}, true},
    TypeTraits{Q8_0, "Q8_0", 32, 34, Q8_0, deq<BlockQ8_0, ref::dequantize_q8_0>, {quant<BlockQ8_0, ref::quantize_q8_0>, quant<BlockQ8_0, avx2::quantize_q8_0>},
               {dot<BlockQ8_0, BlockQ8_0, ref::dot_q8_0>, dot<BlockQ8_0, BlockQ8_0, avx2::dot_q8_0>, dot<BlockQ8_0, BlockQ8_0, avx512::dot_q8_0>},
               {nullptr, nullptr, tile<BlockQ8_0, BlockQ8_0, avx512::tile_q8_0>}, true},
    TypeTraits{MXFP4, "MXFP4", 32, 17, Q8_0, deq<BlockMxfp4, ref::dequantize_mxfp4>, {},
               {dot<BlockMxfp4, BlockQ8_0, ref::dot_mxfp4>, dot<BlockMxfp4, BlockQ8_0, avx2::dot_mxfp4>, dot<BlockMxfp4, BlockQ8_0, avx512::dot_mxfp4>},
               {nullptr, nullptr, tile<BlockMxfp4, BlockQ8_0, avx512::tile_mxfp4>}, true},
    TypeTraits{Q4_K, "Q4_K", 256, 144, Q8_K, deq<BlockQ4K, ref::dequantize_q4_k>, {},
               {dot<BlockQ4K, BlockQ8K, ref::dot_q4_k>, dot<BlockQ4K, BlockQ8K, avx2::dot_q4_k>, dot<BlockQ4K, BlockQ8K, avx512::dot_q4_k>},
               {nullptr, nullptr, tile<BlockQ4K, BlockQ8K, avx512::tile_q4_k>}, true},
    TypeTraits{Q5_K, "Q5_K", 256, 176, Q8_K, deq<BlockQ5K, ref::dequantize_q5_k>, {},
               {dot<BlockQ5K, BlockQ8K, ref::dot_q5_k>, dot<BlockQ5K, BlockQ8K, avx2::dot_q5_k>, dot<BlockQ5K, BlockQ8K, avx512::dot_q5_k>},
               {nullptr, nullptr, tile<BlockQ5K, BlockQ8K, avx512::tile_q5_k>}, true},
    TypeTraits{Q6_K, "Q6_K", 256, 210, Q8_K, deq<BlockQ6K, ref::dequantize_q6_k>, {},
               {dot<BlockQ6K, BlockQ8K, ref::dot_q6_k>, dot<BlockQ6K, BlockQ8K, avx2::dot_q6_k>, dot<BlockQ6K, BlockQ8K, avx512::dot_q6_k>},
               {nullptr, nullptr, tile<BlockQ6K, BlockQ8K, avx512::tile_q6_k>}, true},
    // Activations of the K-quant dots only.
    TypeTraits{Q8_K, "Q8_K", 256, 292, 0, nullptr, {quant<BlockQ8K, ref::quantize_q8_k>, quant<BlockQ8K, avx2::quantize_q8_k>}},
    // Layouts only: the GGUF reader and the pack builder handle them; the kernels do not run them yet.
    layout(Q4_0, "Q4_0", 32, 18), layout(Q4_1, "Q4_1", 32, 20), layout(Q5_1, "Q5_1", 32, 24), layout(Q8_1, "Q8_1", 32, 36),
    layout(Q2_K, "Q2_K", 256, 84), layout(Q3_K, "Q3_K", 256, 110), layout(IQ2_XXS, "IQ2_XXS", 256, 66),
    layout(IQ2_XS, "IQ2_XS", 256, 74), layout(IQ3_XXS, "IQ3_XXS", 256, 98), layout(IQ1_S, "IQ1_S", 256, 50),
    layout(IQ4_NL, "IQ4_NL", 32, 18), layout(IQ3_S, "IQ3_S", 256, 110), layout(IQ2_S, "IQ2_S", 256, 82),
    layout(IQ4_XS, "IQ4_XS", 256, 136), layout(I8, "I8", 1, 1), layout(I16, "I16", 1, 2), layout(I32, "I32", 1, 4),
    layout(I64, "I64", 1, 8), layout(F64, "F64", 1, 8), layout(IQ1_M, "IQ1_M", 256, 56), layout(TQ1_0, "TQ1_0", 256, 54),
    layout(TQ2_0, "TQ2_0", 256, 66),
};
// clang-format on

static_assert(MXFP4 < 64, "type_traits indexes an array of 64 ids");
static_assert(sizeof(BlockQ8_0) == 34 && sizeof(BlockQ5_0) == 22 && sizeof(BlockMxfp4) == 17 &&
              sizeof(BlockQ4K) == 144 && sizeof(BlockQ5K) == 176 && sizeof(BlockQ6K) == 210 &&
              sizeof(BlockQ8K) == 292);

std::string names(bool (*pick)(const TypeTraits&)) {
  std::string s;
  for (const TypeTraits& t : kTypes)
    if (pick(t)) s += (s.empty() ? "" : ", ") + std::string(t.name);
  return s;
}

}  // namespace

// Looked up on every matmul and row conversion: an array indexed by id, built once.
const TypeTraits* type_traits(uint32_t id) {
  static const auto by_id = [] {
    std::array<const TypeTraits*, 64> a{};
    for (const TypeTraits& t : kTypes) a[t.id] = &t;
    return a;
  }();
  return id < by_id.size() ? by_id[id] : nullptr;
}

const TypeTraits* type_by_name(std::string_view name) {
  for (const TypeTraits& t : kTypes) {
    std::string_view n(t.name);
    if (n.size() != name.size()) continue;
    bool eq = true;
    for (size_t i = 0; i < name.size() && eq; ++i)
      eq = std::toupper(static_cast<unsigned char>(name[i])) == n[i];
    if (eq) return &t;
  }
  return nullptr;
}

std::string supported_type_names() {
  return names([](const TypeTraits& t) { return t.dot[0] != nullptr; });
}

std::string cuda_type_names() {
  return names([](const TypeTraits& t) { return t.cuda; });
}

}  // namespace kernels
