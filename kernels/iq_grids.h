// The grid IQ types' groups of 32 weights decoded for the x86 kernels: the tiles
// (avx2_quants.cpp) and both instruction sets' matrix-matrix panels (gemm_avx2.cpp,
// gemm_avx512.cpp) read the same decoders, so the panels unpack what the tiles compute with.
// Internal to kernels/; an unnamed namespace, so each file keeps its own copy, compiled with its
// own flags (rows8_body.h).
//
// IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S (Grid<Block>::group): a group's magnitudes from the grid (unsigned,
// <= 62), their signs as +1 / -1 bytes, and the integer scales of elements 0-15 and 16-31 (the
// same where the type scales 32). Value = sign x magnitude; the super-block's sum is
// d x post x sum of scale x value x activation (post: 0.125 for IQ2_XS and IQ2_S, 0.25 for IQ3_XXS,
// 1 for IQ3_S; ggml's dots).
//
// IQ1_S, IQ1_M (Iq1<Block>::group): value = grid + delta with grid -1, 0 or 1 and delta +-1/8
// (IQ1_S: one delta per 32, IQ1_M one per 8), so 8 x value is an integer, -9..9, and the
// super-block's sum is d x 0.125 x sum of scale x (8 value) x activation: one exact integer sum
// where ggml keeps the delta's share apart (the same real number; the float steps after it are the
// other grid types'). The decoder gives u = 8 value + 9 (0..18, unsigned: vpmaddubsw's operand),
// whose bias the caller takes off as 9 x the scaled activation sums; the tiles build u from
// iq1_grid8's pre-scaled rows and iq1m_deltas' table instead, their bias and IQ1_S's delta in
// factors of those sums.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/dequant.h"
#include "kernels/fp16.h"
#include "kernels/quant_blocks.h"
#include "kernels/x86.h"

namespace kernels {
namespace {

inline __m256i grid4(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  return _mm256_set_epi64x(static_cast<int64_t>(d), static_cast<int64_t>(c),
                           static_cast<int64_t>(b), static_cast<int64_t>(a));
}
// ksigns_iq2xs as bytes of +1 / -1 (llama.cpp's ksigns64): one u64 per 7-bit sign index.
struct Signs64 {
  uint64_t v[128];
  Signs64() {
    for (int i = 0; i < 128; ++i) {
      v[i] = 0;
      for (int j = 0; j < 8; ++j)
        v[i] |= uint64_t(iq::ksigns_iq2xs[i] >> j & 1 ? 0xFF : 0x01) << (8 * j);
    }
  }
};
const Signs64 kSigns;
// Four bytes of sign bits (bit j of byte l: element 8l + j negative) -> +1 / -1 bytes.
inline __m256i signs32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_or_si256(x86::bytes_where_set(v), _mm256_set1_epi8(1));
}

// The eight 4-byte grid rows of an IQ3_XXS or IQ3_S group: by one vpgatherdd, or by eight loads
// where gathers are slow (isa.h's gathers_slow). On an Intel Xeon (2 threads, expert-bench gemv)
// the gather read IQ3_XXS at 12.0 GB/s against 9.9 (AVX-512 body) and 10.2 against 8.2 (AVX2),
// IQ3_S at 12.3-13.0 against 5.0-6.0 and 9.8-10.5 against 5.3-6.3.
template <bool kGather>
__attribute__((always_inline)) inline __m256i iq3xxs_rows8(const uint8_t* q3) {
  if constexpr (kGather) {
    return _mm256_i32gather_epi32(
        reinterpret_cast<const int*>(iq::iq3xxs_grid),
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q3))), 4);
  } else {
    return _mm256_setr_epi32(int(iq::iq3xxs_grid[q3[0]]), int(iq::iq3xxs_grid[q3[1]]),
                             int(iq::iq3xxs_grid[q3[2]]), int(iq::iq3xxs_grid[q3[3]]),
                             int(iq::iq3xxs_grid[q3[4]]), int(iq::iq3xxs_grid[q3[5]]),
                             int(iq::iq3xxs_grid[q3[6]]), int(iq::iq3xxs_grid[q3[7]]));
  }
}
// IQ3_S: element e's index is byte e of qs and bit e of qh as its ninth bit.
template <bool kGather>
__attribute__((always_inline)) inline __m256i iq3s_rows8(const uint8_t* qs, int qh) {
  if constexpr (kGather) {
    const __m256i hi = _mm256_slli_epi32(
        _mm256_and_si256(
            _mm256_srlv_epi32(_mm256_set1_epi32(qh), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)),
            _mm256_set1_epi32(1)),
        8);
    const __m256i idx = _mm256_or_si256(
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs))), hi);
    return _mm256_i32gather_epi32(reinterpret_cast<const int*>(iq::iq3s_grid), idx, 4);
  } else {
    int idx[8];
    for (int l = 0; l < 4; ++l) {
      idx[2 * l] = qs[2 * l] | ((qh << (8 - 2 * l)) & 256);
      idx[2 * l + 1] = qs[2 * l + 1] | ((qh << (7 - 2 * l)) & 256);
    }
    return _mm256_setr_epi32(int(iq::iq3s_grid[idx[0]]), int(iq::iq3s_grid[idx[1]]),
                             int(iq::iq3s_grid[idx[2]]), int(iq::iq3s_grid[idx[3]]),
                             int(iq::iq3s_grid[idx[4]]), int(iq::iq3s_grid[idx[5]]),
                             int(iq::iq3s_grid[idx[6]]), int(iq::iq3s_grid[idx[7]]));
  }
}

struct GridGroup {
  __m256i g, sg;  // magnitudes; +1 / -1
  int s0, s1;     // scales of elements 0-15, 16-31
};

// The blocks of the grid types: their super-block scale and group decoder.
template <class Block>
struct Grid;

template <>
struct Grid<BlockIq2Xs> {
  static constexpr int kSub = 16;
  static constexpr float kPost = 0.125f;
  static float d(const BlockIq2Xs& b) { return fp16_to_fp32(b.d); }
  template <bool = false>  // 8-byte rows: loads (a gather of four was slower for IQ2_XXS)
  static GridGroup group(const BlockIq2Xs& b, int ib) {
    const uint16_t* q = b.qs + 4 * ib;
    return {
        grid4(iq::iq2xs_grid[q[0] & 511], iq::iq2xs_grid[q[1] & 511], iq::iq2xs_grid[q[2] & 511],
              iq::iq2xs_grid[q[3] & 511]),
        grid4(kSigns.v[q[0] >> 9], kSigns.v[q[1] >> 9], kSigns.v[q[2] >> 9], kSigns.v[q[3] >> 9]),
        2 * (b.scales[ib] & 0xf) + 1, 2 * (b.scales[ib] >> 4) + 1};
  }
};

template <>
struct Grid<BlockIq2S> {
  static constexpr int kSub = 16;
  static constexpr float kPost = 0.125f;
  static float d(const BlockIq2S& b) { return fp16_to_fp32(b.d); }
  template <bool = false>
  static GridGroup group(const BlockIq2S& b, int ib) {
    const uint8_t* qs = b.qs + 4 * ib;
    const int qh = b.qh[ib];
    return {grid4(iq::iq2s_grid[qs[0] | ((qh << 8) & 0x300)],
                  iq::iq2s_grid[qs[1] | ((qh << 6) & 0x300)],
                  iq::iq2s_grid[qs[2] | ((qh << 4) & 0x300)],
                  iq::iq2s_grid[qs[3] | ((qh << 2) & 0x300)]),
            signs32(b.qs + 32 + 4 * ib), 2 * (b.scales[ib] & 0xf) + 1, 2 * (b.scales[ib] >> 4) + 1};
  }
};

template <>
struct Grid<BlockIq3Xxs> {
  static constexpr int kSub = 32;
  static constexpr float kPost = 0.25f;
  static float d(const BlockIq3Xxs& b) { return fp16_to_fp32(b.d); }
  template <bool kGather = false>
  static GridGroup group(const BlockIq3Xxs& b, int ib) {
    const uint8_t* q3 = b.qs + 8 * ib;
    uint32_t aux;
    std::memcpy(&aux, b.qs + 64 + 4 * ib, 4);
    const int ls = int(2 * (aux >> 28) + 1);
    return {iq3xxs_rows8<kGather>(q3),
            grid4(kSigns.v[aux & 127], kSigns.v[(aux >> 7) & 127], kSigns.v[(aux >> 14) & 127],
                  kSigns.v[(aux >> 21) & 127]),
            ls, ls};
  }
};

template <>
struct Grid<BlockIq3S> {
  static constexpr int kSub = 32;
  static constexpr float kPost = 1.0f;
  static float d(const BlockIq3S& b) { return fp16_to_fp32(b.d); }
  template <bool kGather = false>
  static GridGroup group(const BlockIq3S& b, int ib) {
    const int ls = 2 * (ib % 2 ? b.scales[ib / 2] >> 4 : b.scales[ib / 2] & 0xf) + 1;
    return {iq3s_rows8<kGather>(b.qs + 8 * ib, b.qh[ib]), signs32(b.signs + 4 * ib), ls, ls};
  }
};

struct Iq1Group {
  __m256i u;   // 8 x value + 9, 0..18
  int s0, s1;  // scales of elements 0-15, 16-31
};
// Grid rows -1 / 0 / 1 and (delta + 1/8) x 8 (0 or 2 per byte): 8 x (grid + delta) + 9.
inline __m256i iq1_u(__m256i grid, __m256i delta8) {
  return _mm256_add_epi8(_mm256_slli_epi16(_mm256_add_epi8(grid, _mm256_set1_epi8(1)), 3),
                         delta8);  // (grid + 1) <= 2: the shift stays in its byte
}

// iq1s_grid's rows as 8 x (grid + 1), bytes 0, 8, 16: with it IQ1_S's u is its row plus the
// delta's share, which the tiles take as an offset of the activation sums.
inline const uint64_t* iq1_grid8() {
  struct Table {
    uint64_t v[2048];
    Table() {
      for (int i = 0; i < 2048; ++i) {
        v[i] = 0;
        for (int j = 0; j < 8; ++j)
          v[i] |= uint64_t(8 * (int8_t(iq::iq1s_grid[i] >> (8 * j)) + 1)) << (8 * j);
      }
    }
  };
  static const Table t;
  return t.v;
}

// IQ1_M's four delta bits of a group (bits 3 and 7 of its two qh bytes, in order) m -> row m:
// 8 x (delta + 1/8) per element, 0 where the bit is set (delta -1/8), else 2.
using DeltaRow = uint8_t[32];
inline const DeltaRow* iq1m_deltas() {
  struct Table {
    alignas(32) uint8_t v[16][32];
    Table() {
      for (int k = 0; k < 16; ++k)
        for (int i = 0; i < 32; ++i) v[k][i] = k >> (i / 8) & 1 ? 0 : 2;
    }
  };
  static const Table t;
  return t.v;
}

// The tiles' IQ1 groups: u from iq1_grid8's rows g (IQ1_S: 8 (grid + 1); IQ1_M: plus the group's
// row of iq1m_deltas), the scales s0, s1 of elements 0-15 and 16-31, and off, the factors of the
// group's two 16-element activation sums that make u's products the exact sum of 8 x value x
// activation (IQ1_S: its delta and the bias 8; IQ1_M: the bias 9).
__attribute__((always_inline)) inline __m256i iq1s_tile_group(const BlockIq1S& b, int ib,
                                                              const uint64_t* g, int& s0, int& s1,
                                                              int16_t* off) {
  const uint16_t qh = b.qh[ib];
  const uint8_t* qs = b.qs + 4 * ib;
  s0 = s1 = 2 * ((qh >> 12) & 7) + 1;
  off[0] = off[1] = int16_t(s0 * (qh & 0x8000 ? -9 : -7));
  return grid4(g[qs[0] | ((qh << 8) & 0x700)], g[qs[1] | ((qh << 5) & 0x700)],
               g[qs[2] | ((qh << 2) & 0x700)], g[qs[3] | ((qh >> 1) & 0x700)]);
}
// kPext: the delta bits (3, 7, 11, 15 of the group's two qh bytes) by one pext (the AVX-512 files,
// built with BMI2) or by shifts (AVX2's: pext is microcoded on AMD's Zen 1 and 2).
template <bool kPext>
__attribute__((always_inline)) inline __m256i iq1m_tile_group(const BlockIq1M& b, int ib,
                                                              const uint64_t* g,
                                                              const DeltaRow* deltas, int& s0,
                                                              int& s1, int16_t* off) {
  const uint8_t* qs = b.qs + 4 * ib;
  const uint32_t h = b.qh[2 * ib] | uint32_t(b.qh[2 * ib + 1]) << 8;
  const uint16_t sc = uint16_t(b.scales[2 * (ib / 2)] | b.scales[2 * (ib / 2) + 1] << 8);
  const int sh = 6 * (ib % 2);
  s0 = 2 * ((sc >> sh) & 7) + 1, s1 = 2 * ((sc >> (sh + 3)) & 7) + 1;
  off[0] = int16_t(-9 * s0), off[1] = int16_t(-9 * s1);
  const __m256i grid = grid4(g[qs[0] | ((h << 8) & 0x700)], g[qs[1] | ((h << 4) & 0x700)],
                             g[qs[2] | (h & 0x700)], g[qs[3] | ((h >> 4) & 0x700)]);
  unsigned m;
  if constexpr (kPext)
    m = _pext_u32(h, 0x8888);
  else
    m = (h >> 3 & 1) | (h >> 6 & 2) | (h >> 9 & 4) | (h >> 12 & 8);
  return _mm256_add_epi8(grid, _mm256_load_si256(reinterpret_cast<const __m256i*>(deltas[m])));
}

template <class Block>
struct Iq1;

template <>
struct Iq1<BlockIq1S> {
  static constexpr int kSub = 32;
  static float d(const BlockIq1S& b) { return fp16_to_fp32(b.d); }
  static Iq1Group group(const BlockIq1S& b, int ib) {
    const uint16_t qh = b.qh[ib];
    const uint8_t* qs = b.qs + 4 * ib;
    const __m256i g = grid4(
        iq::iq1s_grid[qs[0] | ((qh << 8) & 0x700)], iq::iq1s_grid[qs[1] | ((qh << 5) & 0x700)],
        iq::iq1s_grid[qs[2] | ((qh << 2) & 0x700)], iq::iq1s_grid[qs[3] | ((qh >> 1) & 0x700)]);
    const int ls = 2 * ((qh >> 12) & 7) + 1;
    return {iq1_u(g, _mm256_set1_epi8(qh & 0x8000 ? 0 : 2)), ls, ls};
  }
};

template <>
struct Iq1<BlockIq1M> {
  static constexpr int kSub = 16;
  static float d(const BlockIq1M& b) { return fp16_to_fp32(iq1m_scale_bits(b.scales)); }
  static Iq1Group group(const BlockIq1M& b, int ib) {
    const uint8_t* qs = b.qs + 4 * ib;
    const uint8_t* qh = b.qh + 2 * ib;
    const __m256i g = grid4(iq::iq1s_grid[qs[0] | ((qh[0] << 8) & 0x700)],
                            iq::iq1s_grid[qs[1] | ((qh[0] << 4) & 0x700)],
                            iq::iq1s_grid[qs[2] | ((qh[1] << 8) & 0x700)],
                            iq::iq1s_grid[qs[3] | ((qh[1] << 4) & 0x700)]);
    auto delta8 = [](int h) { return h ? 0ull : 0x0202020202020202ull; };  // delta -1/8 or +1/8
    const __m256i dv = grid4(delta8(qh[0] & 0x08), delta8(qh[0] & 0x80), delta8(qh[1] & 0x08),
                             delta8(qh[1] & 0x80));
    const uint16_t sc = uint16_t(b.scales[2 * (ib / 2)] | b.scales[2 * (ib / 2) + 1] << 8);
    const int sh = 6 * (ib % 2);
    return {iq1_u(g, dv), 2 * ((sc >> sh) & 7) + 1, 2 * ((sc >> (sh + 3)) & 7) + 1};
  }
};

// The d of the kb IQ1 super-blocks from `first` in float lanes (zero past kb), for sb_rows_dx.
template <class Block>
__attribute__((always_inline)) inline __m256 iq1_d8(const uint8_t* first, int kb) {
  alignas(32) float d[8] = {};
  for (int k = 0; k < kb; ++k) d[k] = Iq1<Block>::d(reinterpret_cast<const Block*>(first)[k]);
  return _mm256_load_ps(d);
}

}  // namespace
}  // namespace kernels
