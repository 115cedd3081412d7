// Prefill as matrix-matrix work on AVX2 (no VNNI) for the types whose tiles pay most per token,
// Q8_0 and MXFP4 (a float scale per 32 weights): panels of 8 weight rows x 8 tokens. (Without
// vpdpbusd a panel costs what a tile does per weight and token; the K and IQ types' tiles, which
// pay less per token, stayed ahead of it here.) The weights of 8 rows are unpacked once per panel
// to signed bytes and their magnitudes; the activations are laid out once per matrix so that one
// 32-byte load holds four consecutive elements of 8 tokens. Per row and 4 elements: the row's
// magnitudes broadcast, the activations given the weights' signs, vpmaddubsw, vpmaddwd.
//
// The arithmetic is the tiles' (x86.h's tile_b32): each block's exact integer sum, then
// acc + (dx * dy) * I in float lane b % 8, the lanes summed in hsum's order at the end, so a
// token's result is bit for bit the same here, in a tile or as a single dot.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/dequant.h"
#include "kernels/fp16.h"
#include "kernels/gemm_drive.h"
#include "kernels/isa.h"
#include "kernels/kernels.h"

namespace kernels::avx2 {

namespace {

constexpr int kRows = 8, kLanes = 8, kUnit = 256;

struct WUnit {
  alignas(32) int8_t w[kUnit];   // signed values
  alignas(32) uint8_t a[kUnit];  // their magnitudes
  float db[8];                   // the blocks' scales
};

struct AUnit {
  alignas(32) int8_t q[kUnit / 4][kLanes][4];  // [k4][token][4 elements]
  alignas(32) float yd[8][kLanes];             // one per 32-block
};

void magnitudes(WUnit& w) {
  for (int i = 0; i < kUnit; i += 32)
    _mm256_store_si256(
        reinterpret_cast<__m256i*>(w.a + i),
        _mm256_abs_epi8(_mm256_load_si256(reinterpret_cast<const __m256i*>(w.w + i))));
}

void unpack_q8_0(const uint8_t* row, int64_t u, WUnit& w) {
  const BlockQ8_0* b = reinterpret_cast<const BlockQ8_0*>(row) + 8 * u;
  for (int k = 0; k < 8; ++k) {
    w.db[k] = fp16_to_fp32(b[k].d);
    std::memcpy(w.w + 32 * k, b[k].qs, 32);
  }
  magnitudes(w);
}

void unpack_mxfp4(const uint8_t* row, int64_t u, WUnit& w) {
  const BlockMxfp4* b = reinterpret_cast<const BlockMxfp4*>(row) + 8 * u;
  const __m128i table = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kMxfp4Doubled));
  const __m128i m4 = _mm_set1_epi8(0xF);
  for (int k = 0; k < 8; ++k) {
    w.db[k] = e8m0_half(b[k].e);
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[k].qs));
    _mm_store_si128(reinterpret_cast<__m128i*>(w.w + 32 * k),
                    _mm_shuffle_epi8(table, _mm_and_si128(q, m4)));
    _mm_store_si128(reinterpret_cast<__m128i*>(w.w + 32 * k + 16),
                    _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(q, 4), m4)));
  }
  magnitudes(w);
}

using Unpack = void (*)(const uint8_t*, int64_t, WUnit&);
struct GemmType {
  uint32_t id;
  Unpack unpack;
};
const GemmType kGemmTypes[] = {{Q8_0, unpack_q8_0}, {MXFP4, unpack_mxfp4}};
const GemmType* find(uint32_t wtype) {
  for (const GemmType& g : kGemmTypes)
    if (g.id == wtype) return &g;
  return nullptr;
}

template <class A>
A* units_of(A* panel) {
  return reinterpret_cast<A*>((reinterpret_cast<uintptr_t>(panel) + 31) & ~uintptr_t(31));
}

// 8 rows x 8 tokens x one unit (8 blocks): each block's exact sum into the row's float lane s.
void micro(const WUnit* w, const AUnit& a, __m256* acc) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int s = 0; s < 8; ++s) {
    __m256i c[kRows];
    for (int r = 0; r < kRows; ++r) c[r] = _mm256_setzero_si256();
    for (int k = 0; k < 8; ++k) {
      const int k4 = 8 * s + k;
      const __m256i av = _mm256_load_si256(reinterpret_cast<const __m256i*>(a.q[k4]));
      for (int r = 0; r < kRows; ++r) {
        int32_t w4, a4;
        std::memcpy(&w4, w[r].w + 4 * k4, 4);
        std::memcpy(&a4, w[r].a + 4 * k4, 4);
        const __m256i p = _mm256_maddubs_epi16(_mm256_set1_epi32(a4),
                                               _mm256_sign_epi8(av, _mm256_set1_epi32(w4)));
        c[r] = _mm256_add_epi32(c[r], _mm256_madd_epi16(p, ones));
      }
    }
    const __m256 yd = _mm256_load_ps(a.yd[s]);
    for (int r = 0; r < kRows; ++r) {
      const __m256 t = _mm256_mul_ps(_mm256_set1_ps(w[r].db[s]), yd);
      acc[8 * r + s] = _mm256_add_ps(acc[8 * r + s], _mm256_mul_ps(t, _mm256_cvtepi32_ps(c[r])));
    }
  }
}

}  // namespace

bool gemm_supported(uint32_t wtype) {
  return find(wtype) != nullptr;
}

size_t gemm_act_bytes(uint32_t, int64_t cols, int64_t n_tokens) {
  return size_t((n_tokens + kLanes - 1) / kLanes) * size_t(cols / kUnit) * sizeof(AUnit) + 32;
}

void gemm_lay_out(uint32_t, const uint8_t* xq, size_t xq_row, const int32_t* tok, int64_t n_tokens,
                  int64_t cols, uint8_t* panel) {
  AUnit* out = units_of(reinterpret_cast<AUnit*>(panel));
  const int64_t units = cols / kUnit, groups = (n_tokens + kLanes - 1) / kLanes;
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t u = 0; u < units; ++u) {
      AUnit& a = out[g * units + u];
      std::memset(&a, 0, sizeof a);
      for (int t = 0; t < kLanes && g * kLanes + t < n_tokens; ++t) {
        const int64_t i = g * kLanes + t;
        const uint8_t* x = xq + (tok ? tok[i] : i) * xq_row;
        const BlockQ8_0* b = reinterpret_cast<const BlockQ8_0*>(x) + 8 * u;
        for (int k = 0; k < 8; ++k) {
          a.yd[k][t] = fp16_to_fp32(b[k].d);
          for (int k4 = 0; k4 < 8; ++k4) std::memcpy(a.q[8 * k + k4][t], b[k].qs + 4 * k4, 4);
        }
      }
    }
}

void gemm_rows(uint32_t wtype, const void* w, int64_t rows, int64_t cols, int64_t r0, int64_t r1,
               const uint8_t* panel, int64_t n_tokens, float* y) {
  const GemmType& g = *find(wtype);
  const int64_t units = cols / kUnit;
  const size_t w_row = row_size(wtype, cols);
  const AUnit* act = units_of(reinterpret_cast<const AUnit*>(panel));
  x86::drive_rows<kRows, kLanes, WUnit>(
      units, n_tokens, rows, r0, r1,
      [&](int64_t row, int64_t u, WUnit& wu) {
        g.unpack(static_cast<const uint8_t*>(w) + row * w_row, u, wu);
      },
      [](WUnit& wu) { std::memset(&wu, 0, sizeof wu); },
      [&](const WUnit* wp, int64_t gi, float(*out)[kLanes]) {
        __m256 acc[kRows * 8];
        for (__m256& v : acc) v = _mm256_setzero_ps();
        for (int64_t u = 0; u < units; ++u) micro(&wp[size_t(u) * kRows], act[gi * units + u], acc);
        for (int r = 0; r < kRows; ++r) {  // hsum's order of the 8 lanes
          const __m256* a8 = acc + 8 * r;
          _mm256_store_ps(
              out[r], _mm256_add_ps(
                          _mm256_add_ps(_mm256_add_ps(a8[0], a8[4]), _mm256_add_ps(a8[2], a8[6])),
                          _mm256_add_ps(_mm256_add_ps(a8[1], a8[5]), _mm256_add_ps(a8[3], a8[7]))));
        }
      },
      y);
}

}  // namespace kernels::avx2
