// AVX2 bodies of grid types where gathers are fast (isa.h's gathers_slow): IQ1_S, IQ1_M and IQ2_S
// (compiled with avx2_quants.cpp's flags; its bodies call in here). A super-block's 32 row
// indices, scales (and offsets) are made with vector operations once and stored, then a group's
// four grid rows come by one gather, its scales by broadcast loads; per token the arithmetic of
// the row-at-a-time bodies (vpmaddubsw, vpmaddwd with the scales): the same exact sums, so the
// same bits.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/avx2.h"
#include "kernels/iq_grids.h"
#include "kernels/isa.h"

namespace kernels::avx2 {
namespace {

// IQ1_S and IQ1_M (avx2_quants.cpp's iq1_rows): prep fills idx, sc (each 16 elements' scale in both
// halves of an i32), off, and the delta rows' indices dm for IQ1_M.
struct Iq1Prep {
  alignas(32) int32_t idx[32];
  alignas(32) int32_t sc[16];
  alignas(32) int16_t off[16];
  alignas(32) int16_t dm[8];
};
template <int N, class Block, class Prep>
__attribute__((always_inline)) inline void iq1_gather_rows(const Block* x,
                                                           const BlockQ8K* const* ys, int64_t n,
                                                           float* out, const Prep& prep) {
  const long long* grid8 = reinterpret_cast<const long long*>(iq1_grid8());
  const DeltaRow* deltas = iq1m_deltas();
  sb_rows_dx<N, false>(
      x, sizeof(Block), 0, n, ys, 0.125f, out,
      [&](int64_t b, __m256i* I, __m256i*) {
        Iq1Prep p;
        prep(x[b], p);
        asm volatile("" : : : "memory");  // the indices and scales loaded, not extracted
#pragma GCC unroll 8
        for (int ib = 0; ib < 8; ++ib) {
          __m256i u = _mm256_i32gather_epi64(
              grid8, _mm_load_si128(reinterpret_cast<const __m128i*>(p.idx + 4 * ib)), 8);
          if constexpr (Iq1<Block>::kSub == 16)
            u = _mm256_add_epi8(
                u, _mm256_load_si256(reinterpret_cast<const __m256i*>(deltas[p.dm[ib]])));
          const __m256i scale = _mm256_blend_epi32(_mm256_set1_epi32(p.sc[2 * ib]),
                                                   _mm256_set1_epi32(p.sc[2 * ib + 1]), 0xF0);
          for (int t = 0; t < N; ++t)
            I[t] = _mm256_add_epi32(
                I[t],
                _mm256_madd_epi16(_mm256_maddubs_epi16(u, load(ys[t][b].qs + 32 * ib)), scale));
        }
        const __m256i o16 = load(p.off);
        for (int t = 0; t < N; ++t)
          I[t] = _mm256_add_epi32(I[t], _mm256_madd_epi16(o16, load(ys[t][b].bsums)));
      },
      iq1_d8<Block>);
}
// Rows 8k .. 8k + 7's 11-bit indices: low bytes at qs8, high bits (3 each) at `shift` of h.
inline void iq1_indices8(const uint8_t* qs8, const uint8_t* h4, __m256i shift, int32_t* idx) {
  uint32_t h;
  std::memcpy(&h, h4, 4);
  const __m256i hi = _mm256_slli_epi32(
      _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(int(h)), shift), _mm256_set1_epi32(7)),
      8);
  _mm256_store_si256(
      reinterpret_cast<__m256i*>(idx),
      _mm256_or_si256(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs8))),
                      hi));
}
inline __m256i doubled_i32(__m256i s) {
  return _mm256_or_si256(s, _mm256_slli_epi32(s, 16));
}

template <int N>
void iq1s_rows(const BlockIq1S* x, const BlockQ8K* const* ys, int64_t n, float* out) {
  // rows j of groups 2k, 2k + 1: the pair's qh as one dword, row j's bits at 3 (j % 4) + 16 (j /
  // 4)
  const __m256i shift = _mm256_setr_epi32(0, 3, 6, 9, 16, 19, 22, 25);
  iq1_gather_rows<N>(x, ys, n, out, [&](const BlockIq1S& b, Iq1Prep& p) {
    for (int k = 0; k < 4; ++k)
      iq1_indices8(b.qs + 8 * k, reinterpret_cast<const uint8_t*>(b.qh + 2 * k), shift,
                   p.idx + 8 * k);
    const __m128i qh = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qh));
    const __m128i s =
        _mm_or_si128(_mm_and_si128(_mm_srli_epi16(qh, 11), _mm_set1_epi16(14)), _mm_set1_epi16(1));
    const __m128i f =  // the delta's sign ? -9 : -7
        _mm_sub_epi16(_mm_set1_epi16(-7), _mm_and_si128(_mm_srli_epi16(qh, 14), _mm_set1_epi16(2)));
    const __m256i s2 = doubled_i32(_mm256_cvtepu16_epi32(s));  // group g's, each 16 of it
    const __m256i lo = _mm256_unpacklo_epi32(s2, s2), hi = _mm256_unpackhi_epi32(s2, s2);
    _mm256_store_si256(reinterpret_cast<__m256i*>(p.sc), _mm256_permute2x128_si256(lo, hi, 0x20));
    _mm256_store_si256(reinterpret_cast<__m256i*>(p.sc + 8),
                       _mm256_permute2x128_si256(lo, hi, 0x31));
    _mm256_store_si256(reinterpret_cast<__m256i*>(p.off),
                       doubled_i32(_mm256_cvtepu16_epi32(_mm_mullo_epi16(s, f))));
  });
}
template <int N>
void iq1m_rows(const BlockIq1M* x, const BlockQ8K* const* ys, int64_t n, float* out) {
  const __m256i shift = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);  // row j's nibble
  iq1_gather_rows<N>(x, ys, n, out, [&](const BlockIq1M& b, Iq1Prep& p) {
    for (int k = 0; k < 4; ++k) iq1_indices8(b.qs + 8 * k, b.qh + 4 * k, shift, p.idx + 8 * k);
    // a group's delta bits (3, 7, 11, 15 of its two qh bytes) as the index of its delta row
    const __m128i t =
        _mm_and_si128(_mm_srli_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qh)), 3),
                      _mm_set1_epi16(0x1111));
    _mm_store_si128(
        reinterpret_cast<__m128i*>(p.dm),
        _mm_and_si128(_mm_or_si128(_mm_or_si128(t, _mm_srli_epi16(t, 3)),
                                   _mm_or_si128(_mm_srli_epi16(t, 6), _mm_srli_epi16(t, 9))),
                      _mm_set1_epi16(0xF)));
    // 16 c's scale: 3 bits at 3 (c % 4) of scales word c / 4
    const __m256i w =
        _mm256_cvtepu16_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.scales)));
    const __m256i at = _mm256_setr_epi32(0, 3, 6, 9, 0, 3, 6, 9);
    auto scales8 = [&](int w0) {
      const __m256i v = _mm256_permutevar8x32_epi32(
          w, _mm256_setr_epi32(w0, w0, w0, w0, w0 + 1, w0 + 1, w0 + 1, w0 + 1));
      return _mm256_or_si256(
          _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(v, at), _mm256_set1_epi32(7)), 1),
          _mm256_set1_epi32(1));
    };
    const __m256i sa = scales8(0), sb = scales8(2);
    _mm256_store_si256(reinterpret_cast<__m256i*>(p.sc), doubled_i32(sa));
    _mm256_store_si256(reinterpret_cast<__m256i*>(p.sc + 8), doubled_i32(sb));
    _mm256_store_si256(
        reinterpret_cast<__m256i*>(p.off),
        _mm256_mullo_epi16(_mm256_permute4x64_epi64(_mm256_packs_epi32(sa, sb), 0xD8),
                           _mm256_set1_epi16(-9)));
  });
}

// IQ2_S (avx2_quants.cpp's grid_rows): prep fills idx (the grid rows) and sc; signs(b, ib) gives
// group ib's +1 / -1 bytes. (IQ2_XXS and IQ2_XS read no faster so: their rows are 8-bit and 9-bit
// indices, cheap to look up one at a time, and a gather of their signs cost more than it saved.)
struct GridPrep {
  alignas(32) int32_t idx[32];
  alignas(32) int32_t sc[16];
};
template <int N, class Block, class Prep, class Signs>
__attribute__((always_inline)) inline void grid_gather_rows(const Block* x,
                                                            const BlockQ8K* const* ys, int64_t n,
                                                            const uint64_t* grid, float* out,
                                                            const Prep& prep, const Signs& signs) {
  const long long* rows = reinterpret_cast<const long long*>(grid);
  sb_rows<N, false>(
      x, sizeof(Block), 0, 0, n, ys, 0.125f, out, [&](int64_t b, __m256i* I, __m256i*) {
        GridPrep p;
        prep(x[b], p);
        asm volatile("" : : : "memory");  // loaded, not extracted
        for (int ib = 0; ib < 8; ++ib) {
          const __m256i g = _mm256_i32gather_epi64(
              rows, _mm_load_si128(reinterpret_cast<const __m128i*>(p.idx + 4 * ib)), 8);
          const __m256i sg = signs(x[b], ib);
          const __m256i scale = _mm256_blend_epi32(_mm256_set1_epi32(p.sc[2 * ib]),
                                                   _mm256_set1_epi32(p.sc[2 * ib + 1]), 0xF0);
          for (int t = 0; t < N; ++t) {
            const __m256i q8 = _mm256_sign_epi8(load(ys[t][b].qs + 32 * ib), sg);
            I[t] = _mm256_add_epi32(I[t], _mm256_madd_epi16(_mm256_maddubs_epi16(g, q8), scale));
          }
        }
      });
}
// Each 16's scale from 4-bit fields, two a byte, low nibble first (IQ2_XS, IQ2_S).
inline void nibble_scales(const uint8_t* p, int32_t* sc) {
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  const __m128i m4 = _mm_set1_epi8(0xF);
  const __m128i s =
      _mm_unpacklo_epi8(_mm_and_si128(b, m4), _mm_and_si128(_mm_srli_epi16(b, 4), m4));
  auto store = [&](__m128i v, int32_t* at) {
    const __m256i w = _mm256_cvtepu8_epi32(v);
    _mm256_store_si256(reinterpret_cast<__m256i*>(at),
                       doubled_i32(_mm256_or_si256(_mm256_slli_epi32(w, 1), _mm256_set1_epi32(1))));
  };
  store(s, sc);
  store(_mm_srli_si128(s, 8), sc + 8);
}
template <int N>
void iq2s_rows(const BlockIq2S* x, const BlockQ8K* const* ys, int64_t n, float* out) {
  // rows of groups 2k, 2k + 1: two high bits each at 2 j of the pair's qh bytes
  const __m256i shift = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
  grid_gather_rows<N>(
      x, ys, n, iq::iq2s_grid, out,
      [&](const BlockIq2S& b, GridPrep& p) {
        for (int k = 0; k < 4; ++k) {
          const int h = b.qh[2 * k] | b.qh[2 * k + 1] << 8;
          const __m256i hi =
              _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(h), shift),
                                                 _mm256_set1_epi32(3)),
                                8);
          _mm256_store_si256(reinterpret_cast<__m256i*>(p.idx + 8 * k),
                             _mm256_or_si256(_mm256_cvtepu8_epi32(_mm_loadl_epi64(
                                                 reinterpret_cast<const __m128i*>(b.qs + 8 * k))),
                                             hi));
        }
        nibble_scales(b.scales, p.sc);
      },
      [](const BlockIq2S& b, int ib) { return signs32(b.qs + 32 + 4 * ib); });
}

}  // namespace

#define EXPERTD_GATHER_TILE(name, Block, rows)                                               \
  void tile_##name##_gather(const Block* x, const BlockQ8K* const* ys, int n_tok, int64_t n, \
                            float* out) {                                                    \
    with_n(n_tok, [&](auto N) { rows<N>(x, ys, n, out); });                                  \
  }
EXPERTD_GATHER_TILE(iq1_s, BlockIq1S, iq1s_rows)
EXPERTD_GATHER_TILE(iq1_m, BlockIq1M, iq1m_rows)
EXPERTD_GATHER_TILE(iq2_s, BlockIq2S, iq2s_rows)
#undef EXPERTD_GATHER_TILE

}  // namespace kernels::avx2
