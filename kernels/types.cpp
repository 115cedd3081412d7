#include "kernels/types.h"

#include <array>
#include <cctype>

#include "kernels/dequant.h"
#include "kernels/isa.h"
#include "kernels/kernels.h"

namespace kernels {
namespace {

// The table's rows take type-erased pointers; these adapt the typed kernel bodies.
// Every type's dequantizer is the shared decoder of kernels/dequant.h, 32 elements at a time.
template <uint32_t T>
void rows(const void* src, float* y, int64_t n) {
  for (int64_t c = 0; c < n / 32; ++c)
    dequant32<T>(static_cast<const uint8_t*>(src), c, y + 32 * c);
  if constexpr (T == F32 || T == F16 || T == BF16) {  // blocks of one: a row of any length
    for (int64_t i = n / 32 * 32; i < n; ++i) {
      if constexpr (T == F32)
        y[i] = static_cast<const float*>(src)[i];
      else
        y[i] = T == F16 ? dq::h2f(static_cast<const uint16_t*>(src)[i])
                        : dq::bf2f(static_cast<const uint16_t*>(src)[i]);
    }
  }
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
    TypeTraits{F32, "F32", 1, 4, F32, rows<F32>, {quant<float, ref::quantize_f32>},
               {dot<float, float, ref::dot_f32>, dot<float, float, avx2::dot_f32>, dot<float, float, avx2::dot_f32>}, {}, true},
    TypeTraits{F16, "F16", 1, 2, F16, rows<F16>, {quant<uint16_t, ref::quantize_f16>},
               {dot<uint16_t, uint16_t, ref::dot_f16>, dot<uint16_t, uint16_t, avx2::dot_f16>, dot<uint16_t, uint16_t, avx512::dot_f16>}, {}, true},
    TypeTraits{BF16, "BF16", 1, 2, BF16, rows<BF16>, {quant<uint16_t, ref::quantize_bf16>},
               {dot<uint16_t, uint16_t, ref::dot_bf16>, dot<uint16_t, uint16_t, avx2::dot_bf16>, dot<uint16_t, uint16_t, avx512::dot_bf16>}, {}, true},
    TypeTraits{Q5_0, "Q5_0", 32, 22, Q8_0, rows<Q5_0>, {},
               {dot<BlockQ5_0, BlockQ8_0, ref::dot_q5_0>, dot<BlockQ5_0, BlockQ8_0, avx2::dot_q5_0>, dot<BlockQ5_0, BlockQ8_0, avx2::dot_q5_0>}, {}, true},
    TypeTraits{Q8_0, "Q8_0", 32, 34, Q8_0, rows<Q8_0>, {quant<BlockQ8_0, ref::quantize_q8_0>, quant<BlockQ8_0, avx2::quantize_q8_0>, quant<BlockQ8_0, avx512::quantize_q8_0>},
               {dot<BlockQ8_0, BlockQ8_0, ref::dot_q8_0>, dot<BlockQ8_0, BlockQ8_0, avx2::dot_q8_0>, dot<BlockQ8_0, BlockQ8_0, avx512::dot_q8_0>},
               {nullptr, tile<BlockQ8_0, BlockQ8_0, avx2::tile_q8_0>, tile<BlockQ8_0, BlockQ8_0, avx512::tile_q8_0>}, true},
    TypeTraits{MXFP4, "MXFP4", 32, 17, Q8_0, rows<MXFP4>, {},
               {dot<BlockMxfp4, BlockQ8_0, ref::dot_mxfp4>, dot<BlockMxfp4, BlockQ8_0, avx2::dot_mxfp4>, dot<BlockMxfp4, BlockQ8_0, avx512::dot_mxfp4>},
               {nullptr, tile<BlockMxfp4, BlockQ8_0, avx2::tile_mxfp4>, tile<BlockMxfp4, BlockQ8_0, avx512::tile_mxfp4>}, true},
    TypeTraits{Q4_K, "Q4_K", 256, 144, Q8_K, rows<Q4_K>, {},
               {dot<BlockQ4K, BlockQ8K, ref::dot_q4_k>, dot<BlockQ4K, BlockQ8K, avx2::dot_q4_k>, dot<BlockQ4K, BlockQ8K, avx512::dot_q4_k>},
               {nullptr, tile<BlockQ4K, BlockQ8K, avx2::tile_q4_k>, tile<BlockQ4K, BlockQ8K, avx512::tile_q4_k>}, true},
    TypeTraits{Q5_K, "Q5_K", 256, 176, Q8_K, rows<Q5_K>, {},
               {dot<BlockQ5K, BlockQ8K, ref::dot_q5_k>, dot<BlockQ5K, BlockQ8K, avx2::dot_q5_k>, dot<BlockQ5K, BlockQ8K, avx512::dot_q5_k>},
               {nullptr, tile<BlockQ5K, BlockQ8K, avx2::tile_q5_k>, tile<BlockQ5K, BlockQ8K, avx512::tile_q5_k>}, true},
    TypeTraits{Q6_K, "Q6_K", 256, 210, Q8_K, rows<Q6_K>, {},
               {dot<BlockQ6K, BlockQ8K, ref::dot_q6_k>, dot<BlockQ6K, BlockQ8K, avx2::dot_q6_k>, dot<BlockQ6K, BlockQ8K, avx512::dot_q6_k>},
               {nullptr, tile<BlockQ6K, BlockQ8K, avx2::tile_q6_k>, tile<BlockQ6K, BlockQ8K, avx512::tile_q6_k>}, true},
    // Activations of the K-quant dots only.
    TypeTraits{Q8_K, "Q8_K", 256, 292, 0, nullptr, {quant<BlockQ8K, ref::quantize_q8_k>, quant<BlockQ8K, avx2::quantize_q8_k>, quant<BlockQ8K, avx512::quantize_q8_k>}},
    // Activations of the Q4_1 / Q5_1 dots.
    TypeTraits{Q8_1, "Q8_1", 32, 36, 0, rows<Q8_1>, {quant<BlockQ8_1, ref::quantize_q8_1>}},
    // The legacy 32-blocks and IQ4_NL against Q8_0 / Q8_1 activations.
    TypeTraits{Q4_0, "Q4_0", 32, 18, Q8_0, rows<Q4_0>, {},
               {dot<BlockQ4_0, BlockQ8_0, ref::dot_q4_0>, dot<BlockQ4_0, BlockQ8_0, avx2::dot_q4_0>}, {}, true},
    TypeTraits{Q4_1, "Q4_1", 32, 20, Q8_1, rows<Q4_1>, {},
               {dot<BlockQ4_1, BlockQ8_1, ref::dot_q4_1>, dot<BlockQ4_1, BlockQ8_1, avx2::dot_q4_1>}, {}, true},
    TypeTraits{Q5_1, "Q5_1", 32, 24, Q8_1, rows<Q5_1>, {},
               {dot<BlockQ5_1, BlockQ8_1, ref::dot_q5_1>, dot<BlockQ5_1, BlockQ8_1, avx2::dot_q5_1>}, {}, true},
    TypeTraits{IQ4_NL, "IQ4_NL", 32, 18, Q8_0, rows<IQ4_NL>, {},
               {dot<BlockIq4Nl, BlockQ8_0, ref::dot_iq4_nl>, dot<BlockIq4Nl, BlockQ8_0, avx2::dot_iq4_nl>}, {}, true},
    TypeTraits{NVFP4, "NVFP4", 64, 36, Q8_0, rows<NVFP4>, {}, {dot<BlockNvfp4, BlockQ8_0, ref::dot_nvfp4>, dot<BlockNvfp4, BlockQ8_0, avx2::dot_nvfp4>, dot<BlockNvfp4, BlockQ8_0, avx512::dot_nvfp4>},
               {nullptr, tile<BlockNvfp4, BlockQ8_0, avx2::tile_nvfp4>, tile<BlockNvfp4, BlockQ8_0, avx512::tile_nvfp4>}, true},
    TypeTraits{Q1_0, "Q1_0", 128, 18, Q8_0, rows<Q1_0>, {}, {dot<BlockQ1_0, BlockQ8_0, ref::dot_q1_0>, dot<BlockQ1_0, BlockQ8_0, avx2::dot_q1_0>}, {}, true},
    TypeTraits{Q2_0, "Q2_0", 64, 18, Q8_0, rows<Q2_0>, {}, {dot<BlockQ2_0, BlockQ8_0, ref::dot_q2_0>, dot<BlockQ2_0, BlockQ8_0, avx2::dot_q2_0>}, {}, true},
    // Low-bit K-quants, ternary and IQ types against Q8_K activations.
    TypeTraits{Q2_K, "Q2_K", 256, 84, Q8_K, rows<Q2_K>, {},
               {dot<BlockQ2K, BlockQ8K, ref::dot_q2_k>, dot<BlockQ2K, BlockQ8K, avx2::dot_q2_k>, dot<BlockQ2K, BlockQ8K, avx512::dot_q2_k>},
               {nullptr, tile<BlockQ2K, BlockQ8K, avx2::tile_q2_k>, tile<BlockQ2K, BlockQ8K, avx512::tile_q2_k>}, true},
    TypeTraits{Q3_K, "Q3_K", 256, 110, Q8_K, rows<Q3_K>, {},
               {dot<BlockQ3K, BlockQ8K, ref::dot_q3_k>, dot<BlockQ3K, BlockQ8K, avx2::dot_q3_k>, dot<BlockQ3K, BlockQ8K, avx512::dot_q3_k>},
               {nullptr, tile<BlockQ3K, BlockQ8K, avx2::tile_q3_k>, tile<BlockQ3K, BlockQ8K, avx512::tile_q3_k>}, true},
    TypeTraits{TQ1_0, "TQ1_0", 256, 54, Q8_K, rows<TQ1_0>, {}, {dot<BlockTq1_0, BlockQ8K, ref::dot_tq1_0>, dot<BlockTq1_0, BlockQ8K, avx2::dot_tq1_0>, dot<BlockTq1_0, BlockQ8K, avx512::dot_tq1_0>},
               {nullptr, tile<BlockTq1_0, BlockQ8K, avx2::tile_tq1_0>, tile<BlockTq1_0, BlockQ8K, avx512::tile_tq1_0>}, true},
    TypeTraits{TQ2_0, "TQ2_0", 256, 66, Q8_K, rows<TQ2_0>, {}, {dot<BlockTq2_0, BlockQ8K, ref::dot_tq2_0>, dot<BlockTq2_0, BlockQ8K, avx2::dot_tq2_0>, dot<BlockTq2_0, BlockQ8K, avx512::dot_tq2_0>},
               {nullptr, nullptr, tile<BlockTq2_0, BlockQ8K, avx512::tile_tq2_0>}, true},
    TypeTraits{IQ2_XXS, "IQ2_XXS", 256, 66, Q8_K, rows<IQ2_XXS>, {},
               {dot<BlockIq2Xxs, BlockQ8K, ref::dot_iq2_xxs>, dot<BlockIq2Xxs, BlockQ8K, avx2::dot_iq2_xxs>, dot<BlockIq2Xxs, BlockQ8K, avx512::dot_iq2_xxs>},
               {nullptr, tile<BlockIq2Xxs, BlockQ8K, avx2::tile_iq2_xxs>, tile<BlockIq2Xxs, BlockQ8K, avx512::tile_iq2_xxs>}, true},
    TypeTraits{IQ2_XS, "IQ2_XS", 256, 74, Q8_K, rows<IQ2_XS>, {},
               {dot<BlockIq2Xs, BlockQ8K, ref::dot_iq2_xs>, dot<BlockIq2Xs, BlockQ8K, avx2::dot_iq2_xs>, dot<BlockIq2Xs, BlockQ8K, avx512::dot_iq2_xs>},
               {nullptr, tile<BlockIq2Xs, BlockQ8K, avx2::tile_iq2_xs>, tile<BlockIq2Xs, BlockQ8K, avx512::tile_iq2_xs>}, true},
    TypeTraits{IQ2_S, "IQ2_S", 256, 82, Q8_K, rows<IQ2_S>, {},
               {dot<BlockIq2S, BlockQ8K, ref::dot_iq2_s>, dot<BlockIq2S, BlockQ8K, avx2::dot_iq2_s>, dot<BlockIq2S, BlockQ8K, avx512::dot_iq2_s>},
               {nullptr, tile<BlockIq2S, BlockQ8K, avx2::tile_iq2_s>, tile<BlockIq2S, BlockQ8K, avx512::tile_iq2_s>}, true},
    TypeTraits{IQ3_XXS, "IQ3_XXS", 256, 98, Q8_K, rows<IQ3_XXS>, {},
               {dot<BlockIq3Xxs, BlockQ8K, ref::dot_iq3_xxs>, dot<BlockIq3Xxs, BlockQ8K, avx2::dot_iq3_xxs>, dot<BlockIq3Xxs, BlockQ8K, avx512::dot_iq3_xxs>},
               {nullptr, tile<BlockIq3Xxs, BlockQ8K, avx2::tile_iq3_xxs>, tile<BlockIq3Xxs, BlockQ8K, avx512::tile_iq3_xxs>}, true},
    TypeTraits{IQ3_S, "IQ3_S", 256, 110, Q8_K, rows<IQ3_S>, {},
               {dot<BlockIq3S, BlockQ8K, ref::dot_iq3_s>, dot<BlockIq3S, BlockQ8K, avx2::dot_iq3_s>, dot<BlockIq3S, BlockQ8K, avx512::dot_iq3_s>},
               {nullptr, tile<BlockIq3S, BlockQ8K, avx2::tile_iq3_s>, tile<BlockIq3S, BlockQ8K, avx512::tile_iq3_s>}, true},
    TypeTraits{IQ1_S, "IQ1_S", 256, 50, Q8_K, rows<IQ1_S>, {},
               {dot<BlockIq1S, BlockQ8K, ref::dot_iq1_s>, dot<BlockIq1S, BlockQ8K, avx2::dot_iq1_s>, dot<BlockIq1S, BlockQ8K, avx512::dot_iq1_s>},
               {nullptr, tile<BlockIq1S, BlockQ8K, avx2::tile_iq1_s>, tile<BlockIq1S, BlockQ8K, avx512::tile_iq1_s>}, true},
    TypeTraits{IQ1_M, "IQ1_M", 256, 56, Q8_K, rows<IQ1_M>, {},
               {dot<BlockIq1M, BlockQ8K, ref::dot_iq1_m>, dot<BlockIq1M, BlockQ8K, avx2::dot_iq1_m>, dot<BlockIq1M, BlockQ8K, avx512::dot_iq1_m>},
               {nullptr, tile<BlockIq1M, BlockQ8K, avx2::tile_iq1_m>, tile<BlockIq1M, BlockQ8K, avx512::tile_iq1_m>}, true},
    TypeTraits{IQ4_XS, "IQ4_XS", 256, 136, Q8_K, rows<IQ4_XS>, {},
               {dot<BlockIq4Xs, BlockQ8K, ref::dot_iq4_xs>, dot<BlockIq4Xs, BlockQ8K, avx2::dot_iq4_xs>, dot<BlockIq4Xs, BlockQ8K, avx512::dot_iq4_xs>},
               {nullptr, tile<BlockIq4Xs, BlockQ8K, avx2::tile_iq4_xs>, tile<BlockIq4Xs, BlockQ8K, avx512::tile_iq4_xs>}, true},
    // Layouts only: integers and F64, which no weight of a model uses.
    layout(I8, "I8", 1, 1), layout(I16, "I16", 1, 2), layout(I32, "I32", 1, 4),
    layout(I64, "I64", 1, 8), layout(F64, "F64", 1, 8),
};
// clang-format on

static_assert(Q2_0 < 64, "type_traits indexes an array of 64 ids");
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
  static const auto table = [] {
    auto t = kTypes;
    // Zen 4 (halves_512(), isa.h): the super-block types' AVX2 dots and tiles beat their AVX-512
    // ones (one thread, a 1024 x 2048 matrix from L3: AVX-512 at 0.75x AVX2's speed for Q4_K,
    // 0.79x Q2_K, 0.81x Q5_K, 0.88x Q3_K and IQ4_XS, 0.97x Q6_K); both give the same bits
    // (sb_lanes' arithmetic, test Kernels.SuperBlockBodiesGiveTheSameBitsOnBothIsas), so the
    // AVX-512 kernels run the AVX2 bodies of those types there; the panels stay AVX-512's.
    if (halves_512())
      for (TypeTraits& x : t)
        if (x.id == Q4_K || x.id == Q5_K || x.id == Q6_K || x.id == Q2_K || x.id == Q3_K ||
            x.id == IQ4_XS)
          x.dot[2] = x.dot[1], x.tile[2] = x.tile[1];
    return t;
  }();
  static const auto by_id = [] {
    std::array<const TypeTraits*, 64> a{};
    for (const TypeTraits& t : table) a[t.id] = &t;
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
    if (eq) return type_traits(t.id);  // the dispatch table's entry (its bodies for this CPU)
  }
  return nullptr;
}

std::string supported_type_names() {
  return names([](const TypeTraits& t) { return t.dot[0] != nullptr; });
}

std::string cuda_type_names() {
  return names([](const TypeTraits& t) { return t.cuda; });
}

std::string rows8_type_names() {
  return names([](const TypeTraits& t) { return rows8_supported(t.id); });
}

}  // namespace kernels
