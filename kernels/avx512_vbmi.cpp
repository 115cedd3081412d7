// AVX-512 bodies that need VBMI's byte permutes (vpermb, vpermi2b, vpmultishiftqb): Ice Lake and
// later, Zen 4 and later; not Cascade Lake, whose VNNI runs avx512.cpp's bodies. The flags add
// -mavx512vbmi to avx512.cpp's (CMakeLists.txt); avx512.cpp calls in here where has_vbmi().
//
// The grid types look their rows up with loads, a row of 8 weights each, 32 a super-block and a
// few cycles each on the load ports; here the grid's rows are codes of 2 bits a weight (every IQ2
// grid holds only the magnitudes 8, 25 and 43), a row's 16-bit code looked up by byte permutes
// (a table of 256 codes is four registers a byte half), every weight's 2 bits picked by
// vpmultishiftqb and made a magnitude by vpermb. The sums are the AVX2 bodies' exact integers, so
// their bits.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/avx2.h"
#include "kernels/dequant.h"
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

// IQ2_XXS's constants. A super-block's qs are 8 groups of 32 weights, 8 bytes each: four grid
// indices (one per 8 weights) and an aux dword (four 7-bit sign indices, a 4-bit scale on top);
// 8-weight row r (0..31) has its index at byte pos(r) = 8 (r / 4) + r % 4.
struct Iq2XxsConsts {
  alignas(64) uint8_t lo[256];  // grid row g's code: weight j's magnitude index (8, 25, 43 ->
  alignas(64) uint8_t hi[256];  // 0, 1, 2) at bits 2j, 2j + 1; its low and high bytes
  // The codes' layout: qword j holds the codes of rows j, 8 + j, 16 + j, 24 + j (a word each),
  // so that one vpmultishiftqb per 64 weights unpacks rows 8m .. 8m + 7 in order.
  alignas(64) uint8_t code_pos[64];
  alignas(64) uint8_t unpack[4][64];  // m: qword byte i -> the bit offset of its weight i
  alignas(64) uint8_t
      sign_fields[64];               // qword byte l < 4 -> the offset of sign index l of its group
  alignas(64) uint8_t sign_pos[64];  // byte 8m + j -> pos(8m + j): row-ordered sign bytes
  alignas(64) uint8_t scale_pos[4][64];  // m: even bytes -> the scale byte of group 2m or 2m + 1
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
      for (int i = 0; i < 64; ++i) {
        unpack[m][i] = uint8_t(16 * m + 2 * (i % 8));
        scale_pos[m][i] = uint8_t(8 * (2 * m + i / 32) + 7);
      }
    for (int i = 0; i < 64; ++i) sign_fields[i] = uint8_t(32 + 7 * (i % 4));
    for (int i = 0; i < 64; ++i) sign_pos[i] = i < 32 ? pos(i) : 0;
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
// vgf2p8affineqb for the magnitudes, the signs a mask put onto the activations, the two groups'
// scales placed by a vpermb, and per token a maddubs and a vpdpwssd.
template <int N>
void iq2xxs_rows(const BlockIq2Xxs* x, const BlockQ8K* const* ys, int64_t n, float* out) {
  const Iq2XxsConsts& c = kIq2Xxs;
  const __m512i lo0 = load64(c.lo), lo1 = load64(c.lo + 64), lo2 = load64(c.lo + 128),
                lo3 = load64(c.lo + 192);
  const __m512i hi0 = load64(c.hi), hi1 = load64(c.hi + 64), hi2 = load64(c.hi + 128),
                hi3 = load64(c.hi + 192);
  const __m512i code_pos = load64(c.code_pos), sign_fields = load64(c.sign_fields),
                sign_pos = load64(c.sign_pos);
  const __m512i unpack[4] = {load64(c.unpack[0]), load64(c.unpack[1]), load64(c.unpack[2]),
                             load64(c.unpack[3])};
  const __m512i scale_pos[4] = {load64(c.scale_pos[0]), load64(c.scale_pos[1]),
                                load64(c.scale_pos[2]), load64(c.scale_pos[3])};
  const __m512i magnitudes = _mm512_set1_epi64(int64_t(kMagnitudes));
  const __m512i parity = _mm512_set1_epi64(int64_t(kSignParity));
  const __mmask64 high_bytes = 0xAAAAAAAAAAAAAAAAull, low_bytes = 0x5555555555555555ull;
  avx2::sb_rows<N, false>(
      x, sizeof(BlockIq2Xxs), 0, 0, n, ys, 0.125f, out, [&](int64_t b, __m256i* I, __m256i*) {
        const __m512i q = load64(x[b].qs);
        const __m512i idx = _mm512_permutexvar_epi8(code_pos, q);
        const __mmask64 above = _mm512_movepi8_mask(idx);  // rows 128..255
        const __m512i clo = _mm512_mask_blend_epi8(above, _mm512_permutex2var_epi8(lo0, idx, lo1),
                                                   _mm512_permutex2var_epi8(lo2, idx, lo3));
        const __m512i chi = _mm512_mask_blend_epi8(above, _mm512_permutex2var_epi8(hi0, idx, hi1),
                                                   _mm512_permutex2var_epi8(hi2, idx, hi3));
        const __m512i codes = _mm512_mask_blend_epi8(high_bytes, clo, chi);
        const __m512i signs =
            _mm512_gf2p8affine_epi64_epi8(_mm512_multishift_epi64_epi8(sign_fields, q), parity, 0);
        alignas(64) uint64_t negative[8];  // m < 4: the 64 weights 64m.. negated where set
        _mm512_store_si512(negative, _mm512_permutexvar_epi8(sign_pos, signs));
        // every byte b as 2 (b >> 4) + 1: the top byte of a group's aux gives its scale
        const __m512i ls = _mm512_or_si512(
            _mm512_and_si512(_mm512_srli_epi16(q, 3), _mm512_set1_epi8(0x1E)), _mm512_set1_epi8(1));
        // the masks from memory: a load each, not a move from a general register
        asm volatile("" : : : "memory");
        __m512i acc[N];
        for (int t = 0; t < N; ++t) acc[t] = _mm512_setzero_si512();
        for (int m = 0; m < 4; ++m) {
          const __m512i g = _mm512_gf2p8affine_epi64_epi8(
              _mm512_multishift_epi64_epi8(unpack[m], codes), magnitudes, 8);
          const __mmask64 neg = _load_mask64(reinterpret_cast<__mmask64*>(negative + m));
          const __m512i scale = _mm512_maskz_permutexvar_epi8(low_bytes, scale_pos[m], ls);
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

}  // namespace kernels::avx512_vbmi
