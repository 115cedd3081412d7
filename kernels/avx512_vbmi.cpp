// AVX-512 bodies that need the instructions of Ice Lake and later (Zen 4 and later too): VBMI's
// byte permutes (vpermb, vpermi2b, vpmultishiftqb), GFNI's vgf2p8affineqb and BITALG's
// vpshufbitqmb; not Cascade Lake's, whose VNNI runs avx512.cpp's bodies. The flags add them to
// avx512.cpp's (CMakeLists.txt); avx512.cpp calls in here where usable().
//
// IQ2_XXS: a grid row's 8 magnitudes are one of 8, 25, 43 each (every IQ2 grid holds only these),
// so a row is a code of 2 bits a weight; the 256 rows' 16-bit codes are four registers a byte
// half, a super-block's 32 looked up by vpermi2b, every weight's 2 bits picked by vpmultishiftqb
// and made a magnitude by vgf2p8affineqb (an affine map over GF(2) takes 0, 1, 2 to 8, 25, 43).
// IQ3_XXS the same with 3-bit levels (4, 12, .., 52, 62: a vpermb). The grid types with larger
// grids (IQ2_XS, IQ2_S, IQ3_S) gather their rows, 64 weights an instruction, where gathers are
// fast. The sums are the AVX2 bodies' exact integers, so their bits.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/avx2.h"
#include "kernels/dequant.h"
#include "kernels/grid_rows512.h"
#include "kernels/isa.h"

namespace kernels::avx512_vbmi {

namespace {

inline __m256i fold(__m512i v) {  // a super-block's 16 lane sums as 8 (exact: integers)
  return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}
inline __m512i load64(const void* p) {
  return _mm512_loadu_si512(p);
}

// The 8x8 bit matrix of vgf2p8affineqb whose output bit i is the parity of (row(i) & input).
template <class Row>
uint64_t gf2_matrix(Row row) {
  uint64_t a = 0;
  for (int i = 0; i < 8; ++i) a |= uint64_t(row(i)) << (8 * (7 - i));
  return a;
}
// A grid magnitude from its index c = c0 + 2 c1 in a byte's low bits: 8 ^ 17 c0 ^ 35 c1 gives 8,
// 25, 43 (an affine map over GF(2); the byte's other bits ignored).
const uint64_t kMagnitudes =
    gf2_matrix([](int i) { return ((17 >> i) & 1) | (((35 >> i) & 1) << 1); });
// ksigns_iq2xs as a map: a 7-bit sign index keeps its bits, the eighth is their parity.
const uint64_t kSignParity = gf2_matrix([](int i) { return i < 7 ? 1 << i : 0x7F; });

// A table of 256 16-bit codes (IQ2_XXS's, IQ3_XXS's grid rows), four registers a byte half.
struct CodeRegs {
  __m512i lo[4], hi[4];
  CodeRegs(const uint8_t* lo_bytes, const uint8_t* hi_bytes) {
    for (int k = 0; k < 4; ++k)
      lo[k] = load64(lo_bytes + 64 * k), hi[k] = load64(hi_bytes + 64 * k);
  }
  // The low and high code bytes of the 64 rows idx's bytes name: two vpermi2b a half (rows below
  // and above 128), a blend by the top bit.
  void look_up(__m512i idx, __m512i& l, __m512i& h) const {
    const __mmask64 above = _mm512_movepi8_mask(idx);
    l = _mm512_mask_blend_epi8(above, _mm512_permutex2var_epi8(lo[0], idx, lo[1]),
                               _mm512_permutex2var_epi8(lo[2], idx, lo[3]));
    h = _mm512_mask_blend_epi8(above, _mm512_permutex2var_epi8(hi[0], idx, hi[1]),
                               _mm512_permutex2var_epi8(hi[2], idx, hi[3]));
  }
};

// IQ2_XXS's constants. A super-block's qs are 8 groups of 32 weights, 8 bytes each: four grid
// indices (one per 8 weights) and an aux dword (four 7-bit sign indices, a 4-bit scale on top);
// 8-weight row r (0..31) has its index at byte pos(r) = 8 (r / 4) + r % 4.
struct Iq2XxsConsts {
  alignas(64) uint8_t lo[256];  // grid row g's code: weight j's magnitude index (8, 25, 43 ->
  alignas(64) uint8_t hi[256];  // 0, 1, 2) at bits 2j, 2j + 1; its low and high bytes
  // The codes' layout: qword j holds the codes of rows j, 8 + j, 16 + j, 24 + j (a word each),
  // so that one vpmultishiftqb per 64 weights unpacks rows 8m .. 8m + 7 in order.
  alignas(64) uint8_t code_pos[64];
  alignas(64) uint8_t unpack[4][64];    // m: qword byte i -> the bit offset of its weight i
  alignas(64) uint8_t sign_fields[64];  // qword byte l < 4 -> sign index l's offset
  alignas(64) uint8_t sign_pos[64];     // byte 8j + m -> pos(8m + j): row 8m + j's sign byte
  // scales[s0 + 16 s1]: 2 s0 + 1 in the low 16 i16 lanes (group 2m), 2 s1 + 1 in the high (2m + 1)
  alignas(64) int16_t scales[256][32];
  Iq2XxsConsts() {
    for (int g = 0; g < 256; ++g) {
      uint32_t code = 0;
      for (int j = 0; j < 8; ++j) {
        const uint8_t v = uint8_t(iq::iq2xxs_grid[g] >> (8 * j));
        code |= uint32_t(v == 25 ? 1 : v == 43 ? 2 : 0) << (2 * j);
      }
      lo[g] = uint8_t(code), hi[g] = uint8_t(code >> 8);
    }
    auto pos = [](int r) { return uint8_t(8 * (r / 4) + r % 4); };
    for (int j = 0; j < 8; ++j)
      for (int m = 0; m < 4; ++m)
        code_pos[8 * j + 2 * m] = code_pos[8 * j + 2 * m + 1] = pos(8 * m + j);
    for (int m = 0; m < 4; ++m)
      for (int i = 0; i < 64; ++i) unpack[m][i] = uint8_t(16 * m + 2 * (i % 8));
    for (int k = 0; k < 256; ++k)
      for (int i = 0; i < 32; ++i) scales[k][i] = int16_t(2 * (i < 16 ? k % 16 : k / 16) + 1);
    for (int i = 0; i < 64; ++i) sign_fields[i] = uint8_t(32 + 7 * (i % 4));
    for (int i = 0; i < 64; ++i) sign_pos[i] = i % 8 < 4 ? pos(8 * (i % 8) + i / 8) : 0;
  }
};
const Iq2XxsConsts kIq2Xxs;

}  // namespace

bool usable() {
  static const bool v = __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("gfni");
  return v;
}

// IQ2_XXS: a super-block's 32 row codes by four vpermi2b (each a table of 128 bytes: low or high
// code bytes of rows below or above 128); its 32 sign indices picked by one vpmultishiftqb, their
// parity bits added by one vgf2p8affineqb; then per 64 weights a vpmultishiftqb and a
// vgf2p8affineqb for the magnitudes, the signs a mask (one vpshufbitqmb) put onto the
// activations, the two groups' scales a row of a table (two scalar byte loads name it), and per
// token a maddubs and a vpdpwssd. On Zen 4 the masks as loads of a stored vector and the scales by
// a vpermb decoded 1.2x slower (the store's forwarding to 8-byte loads, and the permutes' unit).
template <int N>
void iq2xxs_rows(const BlockIq2Xxs* x, const BlockQ8K* const* ys, int64_t n, float* out) {
  const Iq2XxsConsts& c = kIq2Xxs;
  const CodeRegs table(c.lo, c.hi);
  const __m512i code_pos = load64(c.code_pos), sign_fields = load64(c.sign_fields),
                sign_pos = load64(c.sign_pos);
  const __m512i unpack[4] = {load64(c.unpack[0]), load64(c.unpack[1]), load64(c.unpack[2]),
                             load64(c.unpack[3])};
  const __m512i magnitudes = _mm512_set1_epi64(int64_t(kMagnitudes));
  const __m512i parity = _mm512_set1_epi64(int64_t(kSignParity));
  const __mmask64 high_bytes = 0xAAAAAAAAAAAAAAAAull;
  avx2::sb_rows<N, false>(
      x, sizeof(BlockIq2Xxs), 0, 0, n, ys, 0.125f, out, [&](int64_t b, __m256i* I, __m256i*) {
        const __m512i q = load64(x[b].qs);
        __m512i clo, chi;
        table.look_up(_mm512_permutexvar_epi8(code_pos, q), clo, chi);
        const __m512i codes = _mm512_mask_blend_epi8(high_bytes, clo, chi);
        const __m512i signs =
            _mm512_gf2p8affine_epi64_epi8(_mm512_multishift_epi64_epi8(sign_fields, q), parity, 0);
        // qword j's byte m: row 8m + j's signs, so that mask m (the 64 weights 64m.. negated
        // where set) is byte m of every qword by one vpshufbitqmb: no trip through memory
        const __m512i negative = _mm512_permutexvar_epi8(sign_pos, signs);
        __m512i acc[N];
        for (int t = 0; t < N; ++t) acc[t] = _mm512_setzero_si512();
        for (int m = 0; m < 4; ++m) {
          const __m512i g = _mm512_gf2p8affine_epi64_epi8(
              _mm512_multishift_epi64_epi8(unpack[m], codes), magnitudes, 8);
          const __mmask64 neg = _mm512_bitshuffle_epi64_mask(
              negative, _mm512_set1_epi64(0x0706050403020100 + 0x0808080808080808 * m));
          const uint8_t* qb =
              reinterpret_cast<const uint8_t*>(x[b].qs) + 16 * m;  // the auxes' tops
          const __m512i scale = load64(c.scales[(qb[7] >> 4) | (qb[15] & 0xF0)]);
          for (int t = 0; t < N; ++t) {
            const __m512i y = load64(ys[t][b].qs + 64 * m);
            const __m512i q8 = _mm512_mask_sub_epi8(y, neg, _mm512_setzero_si512(), y);
            acc[t] = _mm512_dpwssd_epi32(acc[t], _mm512_maddubs_epi16(g, q8), scale);
          }
        }
        for (int t = 0; t < N; ++t) I[t] = fold(acc[t]);
      });
}

void tile_iq2_xxs(const BlockIq2Xxs* x, const BlockQ8K* const* ys, int n_tok, int64_t n,
                  float* out) {
  x86::with_n(n_tok, [&](auto N) { iq2xxs_rows<N>(x, ys, n, out); });
}

namespace {

// IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S where gathers are fast: 64 weights a step, their grid rows (8 of
// 8 bytes or 16 of 4) gathered by one instruction, the signs a 64-bit mask put onto the
// activations (7-bit indices get their parity bit by vgf2p8affineqb and become the mask by
// vpshufbitqmb; whole sign bytes are the mask as they lie), the super-block's sixteen 16-element
// scales made once and a step's picked by vpermd. Per token a vpdpbusd (four products a lane,
// <= 4 x 62 x 127: the lane fits 16 bits) and a vpdpwssd with the scale on its low word: the AVX2
// bodies' exact sums (avx2_quants.cpp's grid_rows), so their bits.
// rows(block, m, neg): weights 64m .. 64m + 63's magnitudes, their signs into neg; scales(block):
// 16 i16 lanes, the scale (2 s + 1) of each 16 elements.
template <int N, class Block, class Rows, class Scales>
__attribute__((always_inline)) inline void grid_gather(const Block* x, const BlockQ8K* const* ys,
                                                       int64_t n, float post, float* out,
                                                       const Rows& rows, const Scales& scales) {
  const __m512i quarter = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  avx2::sb_rows<N, false>(
      x, sizeof(Block), 0, 0, n, ys, post, out, [&](int64_t b, __m256i* I, __m256i*) {
        const __m512i s16 = _mm512_cvtepu16_epi32(scales(x[b]));  // the scale in the low word
        __m512i acc[N];
        for (int t = 0; t < N; ++t) acc[t] = _mm512_setzero_si512();
        for (int m = 0; m < 4; ++m) {
          __mmask64 neg;
          const __m512i g = rows(x[b], m, neg);
          const __m512i sc = _mm512_permutexvar_epi32(
              _mm512_add_epi32(quarter, _mm512_set1_epi32(4 * m)), s16);  // 16s 4m .. 4m + 3
          for (int t = 0; t < N; ++t) {
            const __m512i y = load64(ys[t][b].qs + 64 * m);
            acc[t] = _mm512_dpwssd_epi32(
                acc[t],
                _mm512_dpbusd_epi32(_mm512_setzero_si512(), g,
                                    _mm512_mask_sub_epi8(y, neg, _mm512_setzero_si512(), y)),
                sc);
          }
        }
        for (int t = 0; t < N; ++t) I[t] = fold(acc[t]);
      });
}

// The mask of 64 weights whose sign indices (7 bits) are the low bits of each qword of v, its
// other bits ignored: bit 8j + i is sign i of ksigns_iq2xs[index j].
inline __mmask64 sign_mask(__m512i v) {
  const __m512i bit_of_byte0 = _mm512_set1_epi64(0x0706050403020100);
  return _mm512_bitshuffle_epi64_mask(
      _mm512_gf2p8affine_epi64_epi8(v, _mm512_set1_epi64(int64_t(kSignParity)), 0), bit_of_byte0);
}
inline __mmask64 mask_at(const uint8_t* p) {  // 64 sign bits as they lie
  uint64_t v;
  std::memcpy(&v, p, 8);
  return _cvtu64_mask64(v);
}
inline __m512i lanes_u32(const uint8_t* p) {  // the dword at p in every i32 lane
  uint32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(int(v));
}
// 16 i16 lanes: 2 s + 1 of each 4-bit s of 8 bytes, low nibble first (IQ2_XS, IQ2_S).
inline __m256i nibble_scales16(const uint8_t* p) {
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  const __m128i m4 = _mm_set1_epi8(0xF);
  const __m256i s = _mm256_cvtepu8_epi16(
      _mm_unpacklo_epi8(_mm_and_si128(b, m4), _mm_and_si128(_mm_srli_epi16(b, 4), m4)));
  return _mm256_or_si256(_mm256_slli_epi16(s, 1), _mm256_set1_epi16(1));
}
// 16 i16 lanes from 8 scales s in i32 lanes: 2 s + 1 twice each (a group of 32's two 16s).
inline __m256i pair_scales16(__m256i s) {
  const __m256i ls = _mm256_or_si256(_mm256_slli_epi32(s, 1), _mm256_set1_epi32(1));
  return _mm256_or_si256(ls, _mm256_slli_epi32(ls, 16));
}

template <int N, bool kLoads>
void iq2xs_rows(const BlockIq2Xs* x, const BlockQ8K* const* ys, int64_t n, float* out) {
  grid_gather<N>(
      x, ys, n, 0.125f, out,
      [](const BlockIq2Xs& b, int m, __mmask64& neg) {
        const __m512i w =  // eight rows' 9-bit index and 7-bit sign index
            _mm512_cvtepu16_epi64(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs + 8 * m)));
        neg = sign_mask(_mm512_srli_epi64(w, 9));
        return grid_rows64<kLoads>(iq::iq2xs_grid, _mm512_and_si512(w, _mm512_set1_epi64(511)));
      },
      [](const BlockIq2Xs& b) { return nibble_scales16(b.scales); });
}

template <int N, bool kLoads>
void iq2s_rows(const BlockIq2S* x, const BlockQ8K* const* ys, int64_t n, float* out) {
  // rows 8m + j: group 2m + j / 4's qh byte at 8 (j / 4) of the dword from qh + 2m, row j % 4's
  // two high bits at 2 (j % 4) of it, rotated to bits 8-9
  const __m512i rot = _mm512_setr_epi64(8, 6, 4, 2, 0, 62, 60, 58);
  grid_gather<N>(
      x, ys, n, 0.125f, out,
      [&](const BlockIq2S& b, int m, __mmask64& neg) {
        const __m512i lo =
            _mm512_cvtepu8_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.qs + 8 * m)));
        const __m512i idx = _mm512_ternarylogic_epi64(
            _mm512_rolv_epi64(lanes_u32(b.qh + 2 * m), rot), _mm512_set1_epi64(0x300), lo, 0xEA);
        neg = mask_at(b.qs + 32 + 8 * m);
        return grid_rows64<kLoads>(iq::iq2s_grid, idx);
      },
      [](const BlockIq2S& b) { return nibble_scales16(b.scales); });
}

template <int N>
void iq3s_rows(const BlockIq3S* x, const BlockQ8K* const* ys, int64_t n, float* out) {
  // row r of the 16 (groups 2m, 2m + 1): its ninth index bit is bit r of qh[2m] | qh[2m + 1] << 8
  const __m512i at = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  grid_gather<N>(
      x, ys, n, 1.0f, out,
      [&](const BlockIq3S& b, int m, __mmask64& neg) {
        const __m512i lo =
            _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs + 16 * m)));
        const __m512i hi = _mm512_srlv_epi32(_mm512_slli_epi32(lanes_u32(b.qh + 2 * m), 8), at);
        const __m512i idx = _mm512_ternarylogic_epi32(hi, _mm512_set1_epi32(0x100), lo, 0xEA);
        neg = mask_at(b.signs + 8 * m);
        return _mm512_i32gather_epi32(idx, iq::iq3s_grid, 4);
      },
      [](const BlockIq3S& b) {
        uint32_t v;
        std::memcpy(&v, b.scales, 4);
        const __m256i s =
            _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(int(v)),
                                               _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                             _mm256_set1_epi32(0xF));
        return pair_scales16(s);
      });
}

// IQ3_XXS by byte permutes: a grid row's 4 magnitudes are levels 0..7 (4, 12, .., 52, 62), a
// 12-bit code; the 64 rows' low and high code bytes by two vpermi2b each, the words placed so
// that qword j of a step holds its two rows' codes, each weight's 3 bits picked by vpmultishiftqb
// and made a magnitude by vpermb.
struct Iq3XxsConsts {
  alignas(64) uint8_t lo[256];
  alignas(64) uint8_t hi[256];
  alignas(64) uint8_t levels[64];    // x -> the magnitude of level x % 8
  alignas(64) uint8_t place[2][64];  // the code words of steps 2h, 2h + 1 from the low / high bytes
  alignas(64) uint8_t unpack[2][64];  // step m % 2: qword byte i -> its weight's bit offset
  Iq3XxsConsts() {
    for (int g = 0; g < 256; ++g) {
      uint32_t code = 0;
      for (int p = 0; p < 4; ++p) {
        const uint8_t v = uint8_t(iq::iq3xxs_grid[g] >> (8 * p));
        code |= uint32_t(v == 62 ? 7 : (v - 4) / 8) << (3 * p);
      }
      lo[g] = uint8_t(code), hi[g] = uint8_t(code >> 8);
    }
    for (int x = 0; x < 64; ++x) levels[x] = uint8_t(x % 8 == 7 ? 62 : 4 + 8 * (x % 8));
    for (int h = 0; h < 2; ++h)
      for (int j = 0; j < 8; ++j)
        for (int t = 0; t < 4; ++t) {  // word t of qword j: row 32h + 16 (t / 2) + 2j + t % 2
          const int r = 32 * h + 16 * (t / 2) + 2 * j + t % 2, w = 4 * j + t;
          place[h][2 * w] = uint8_t(r), place[h][2 * w + 1] = uint8_t(64 + r);
        }
    for (int odd = 0; odd < 2; ++odd)
      for (int i = 0; i < 64; ++i)
        unpack[odd][i] = uint8_t(32 * odd + 16 * ((i % 8) / 4) + 3 * (i % 4));
  }
};
const Iq3XxsConsts kIq3Xxs;

template <int N>
void iq3xxs_rows(const BlockIq3Xxs* x, const BlockQ8K* const* ys, int64_t n, float* out) {
  const Iq3XxsConsts& c = kIq3Xxs;
  const CodeRegs table(c.lo, c.hi);
  const __m512i levels = load64(c.levels), place0 = load64(c.place[0]), place1 = load64(c.place[1]);
  const __m512i unpack0 = load64(c.unpack[0]), unpack1 = load64(c.unpack[1]);
  const __m512i at = _mm512_setr_epi64(0, 7, 14, 21, 32, 39, 46, 53);
  __m512i codes[2];
  grid_gather<N>(
      x, ys, n, 0.25f, out,
      [&](const BlockIq3Xxs& b, int m, __mmask64& neg) {
        if (m == 0) {
          __m512i l, h;
          table.look_up(load64(b.qs), l, h);
          codes[0] = _mm512_permutex2var_epi8(l, place0, h);
          codes[1] = _mm512_permutex2var_epi8(l, place1, h);
        }
        int64_t aux2;
        std::memcpy(&aux2, b.qs + 64 + 8 * m, 8);
        neg = sign_mask(_mm512_srlv_epi64(_mm512_set1_epi64(aux2), at));
        return _mm512_permutexvar_epi8(
            _mm512_multishift_epi64_epi8(m % 2 ? unpack1 : unpack0, codes[m / 2]), levels);
      },
      [](const BlockIq3Xxs& b) {
        return pair_scales16(
            _mm256_srli_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 64)), 28));
      });
}

}  // namespace

void tile_iq2_xs(const BlockIq2Xs* x, const BlockQ8K* const* ys, int n_tok, int64_t n, float* out) {
  x86::with_n(n_tok, [&](auto N) {
    gathers_by_loads() ? iq2xs_rows<N, true>(x, ys, n, out) : iq2xs_rows<N, false>(x, ys, n, out);
  });
}
void tile_iq2_s(const BlockIq2S* x, const BlockQ8K* const* ys, int n_tok, int64_t n, float* out) {
  x86::with_n(n_tok, [&](auto N) {
    gathers_by_loads() ? iq2s_rows<N, true>(x, ys, n, out) : iq2s_rows<N, false>(x, ys, n, out);
  });
}
void tile_iq3_xxs(const BlockIq3Xxs* x, const BlockQ8K* const* ys, int n_tok, int64_t n,
                  float* out) {
  x86::with_n(n_tok, [&](auto N) { iq3xxs_rows<N>(x, ys, n, out); });
}
void tile_iq3_s(const BlockIq3S* x, const BlockQ8K* const* ys, int n_tok, int64_t n, float* out) {
  x86::with_n(n_tok, [&](auto N) { iq3s_rows<N>(x, ys, n, out); });
}

}  // namespace kernels::avx512_vbmi
