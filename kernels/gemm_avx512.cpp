// Prefill as matrix-matrix work (AVX-512 VNNI): a batch of tokens against a weight matrix in
// panels of 8 weight rows x 16 tokens. The weights of 8 rows are unpacked once per panel into one
// unsigned byte per weight (the value plus a bias), integer sub-block scales and float block
// scales; the activations are laid out once per matrix so that one 64-byte load holds four
// consecutive elements of 16 tokens. Each vpdpbusd then adds 4 products for 16 tokens of one row
// (the row's 4 bytes broadcast), 8 rows reusing each activation load.
//
// The arithmetic is the tiles' (avx512.cpp, and AVX2's, which give the same bits): per
// super-block (per 32-element block for Q8_0 and MXFP4) the exact integer sum, then
// acc = acc + (d * yd) * I (less (dmin * yd) * M for the types with mins) in float lane b % 8,
// the lanes summed in x86::hsum's order at the end (avx2.h's sb_lanes). So a token's result is bit
// for bit the same whether it is computed here, in a tile of 1..4 tokens or as a single dot.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/dequant.h"
#include "kernels/fp16.h"
#include "kernels/gemm_drive.h"
#include "kernels/gemm_float.h"
#include "kernels/iq_grids.h"
#include "kernels/isa.h"
#include "kernels/kernels.h"
#include "kernels/x86.h"

namespace kernels::avx512 {

namespace {

constexpr int kRows = 8;    // weight rows per panel (registers: 8 sums, 8 scaled sums, 8 mins)
constexpr int kLanes = 16;  // tokens per panel (i32 lanes of a zmm)
constexpr int kUnit = 256;  // elements per unit: a super-block, or 8 blocks of 32

// One unit of one weight row, unpacked.
struct WUnit {
  alignas(64) uint8_t code[kUnit];  // value + bias, unsigned
  int32_t sc[16];                   // integer scale per sub-block (16 or 32 elements)
  int32_t mn[16];                   // integer min per sub-block (types with mins)
  float d, dmin;                    // super-block scales
  float db[8];                      // per-32 block scales (Q8_0, MXFP4)
};

// One unit of 16 tokens' activations.
struct AUnit {
  alignas(64) int8_t q[kUnit / 4][kLanes][4];  // [k4][token][4 elements]
  alignas(64) int32_t sum16[16][kLanes];       // the sums of 16 consecutive elements
  alignas(64) float yd[8][kLanes];             // Q8_K: yd[0]; Q8_0: one per 32-block
};

// How a type's unpacked unit is combined (see the file comment).
struct Shape {
  int sub;       // elements per integer scale: 16 or 32
  int bias;      // the code's bias: value = code - bias
  bool mins;     // value also has - dmin * mn
  bool block32;  // float scale per 32 elements, no integer scale (Q8_0, MXFP4)
  float post;    // the result's final factor (IQ2_XXS: 0.125)
};

// --- Unpacking one unit of a row (u: the unit's index in the row) ---

void unpack_q4_k(const uint8_t* row, int64_t u, WUnit& w) {
  const BlockQ4K& b = reinterpret_cast<const BlockQ4K*>(row)[u];
  uint8_t sm[16];
  k_scales_mins(b.scales, sm);
  for (int s = 0; s < 8; ++s) w.sc[s] = sm[s], w.mn[s] = sm[8 + s];
  w.d = fp16_to_fp32(b.d), w.dmin = fp16_to_fp32(b.dmin);
  x86::k45_codes<false>(b.qs, nullptr, w.code);
}

void unpack_q5_k(const uint8_t* row, int64_t u, WUnit& w) {
  const BlockQ5K& b = reinterpret_cast<const BlockQ5K*>(row)[u];
  uint8_t sm[16];
  k_scales_mins(b.scales, sm);
  for (int s = 0; s < 8; ++s) w.sc[s] = sm[s], w.mn[s] = sm[8 + s];
  w.d = fp16_to_fp32(b.d), w.dmin = fp16_to_fp32(b.dmin);
  x86::k45_codes<true>(b.qs, b.qh, w.code);
}

void unpack_q6_k(const uint8_t* row, int64_t u, WUnit& w) {
  const BlockQ6K& b = reinterpret_cast<const BlockQ6K*>(row)[u];
  for (int s = 0; s < 16; ++s) w.sc[s] = b.scales[s];
  w.d = fp16_to_fp32(b.d);
  x86::q6k_codes(b, w.code);
}

void unpack_q2_k(const uint8_t* row, int64_t u, WUnit& w) {
  const BlockQ2K& b = reinterpret_cast<const BlockQ2K*>(row)[u];
  for (int s = 0; s < 16; ++s) w.sc[s] = b.scales[s] & 0xF, w.mn[s] = b.scales[s] >> 4;
  w.d = fp16_to_fp32(b.d), w.dmin = fp16_to_fp32(b.dmin);
  x86::q2k_codes(b, w.code);
}

void unpack_q3_k(const uint8_t* row, int64_t u, WUnit& w) {
  const BlockQ3K& b = reinterpret_cast<const BlockQ3K*>(row)[u];
  int8_t sc[16];
  q3k_scales(b.scales, sc);
  for (int s = 0; s < 16; ++s) w.sc[s] = sc[s] - 32;
  w.d = fp16_to_fp32(b.d);
  x86::q3k_codes(b, w.code);
}

void unpack_iq2_xxs(const uint8_t* row, int64_t u, WUnit& w) {
  const BlockIq2Xxs& b = reinterpret_cast<const BlockIq2Xxs*>(row)[u];
  const uint8_t* q = reinterpret_cast<const uint8_t*>(b.qs);
  w.d = fp16_to_fp32(b.d);
  const __m256i bias = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int ib = 0; ib < 8; ++ib, q += 8) {
    uint32_t aux;
    std::memcpy(&aux, q + 4, 4);
    const __m256i g = x86::iq2xxs_grid(q);
    const __mmask32 neg = static_cast<__mmask32>(x86::iq2xxs_negative(aux));
    const __m256i v = _mm256_mask_sub_epi8(g, neg, _mm256_setzero_si256(), g);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(w.code + 32 * ib), _mm256_add_epi8(v, bias));
    w.sc[ib] = int32_t(2 * (aux >> 28) + 1);
  }
}

// The other grid IQ types (iq_grids.h) as IQ2_XXS: group ib's signed values + 128, and the
// scales of its sub-blocks (kSub elements).
template <int kSub>
void store_group(WUnit& w, int ib, __m256i v, int s0, int s1) {
  _mm256_store_si256(reinterpret_cast<__m256i*>(w.code + 32 * ib),
                     _mm256_add_epi8(v, _mm256_set1_epi8(static_cast<char>(0x80))));
  if constexpr (kSub == 32) {
    w.sc[ib] = s0;
  } else {
    w.sc[2 * ib] = s0, w.sc[2 * ib + 1] = s1;
  }
}

template <class Block>
void unpack_grid(const uint8_t* row, int64_t u, WUnit& w) {
  const Block& b = reinterpret_cast<const Block*>(row)[u];
  w.d = Grid<Block>::d(b);
  for (int ib = 0; ib < 8; ++ib) {
    const GridGroup q = Grid<Block>::group(b, ib);
    store_group<Grid<Block>::kSub>(w, ib, _mm256_sign_epi8(q.g, q.sg), q.s0, q.s1);
  }
}

template <class Block>  // IQ1_S, IQ1_M: 8 x value, -9..9
void unpack_iq1(const uint8_t* row, int64_t u, WUnit& w) {
  const Block& b = reinterpret_cast<const Block*>(row)[u];
  w.d = Iq1<Block>::d(b);
  for (int ib = 0; ib < 8; ++ib) {
    const Iq1Group q = Iq1<Block>::group(b, ib);
    store_group<Iq1<Block>::kSub>(w, ib, _mm256_sub_epi8(q.u, _mm256_set1_epi8(9)), q.s0, q.s1);
  }
}

void unpack_iq4_xs(const uint8_t* row, int64_t u, WUnit& w) {
  const BlockIq4Xs& b = reinterpret_cast<const BlockIq4Xs*>(row)[u];
  w.d = fp16_to_fp32(b.d);
  const __m128i table = _mm_loadu_si128(reinterpret_cast<const __m128i*>(iq::kvalues_iq4nl));
  const __m128i m4 = _mm_set1_epi8(0xF), bias = _mm_set1_epi8(static_cast<char>(0x80));
  for (int ib = 0; ib < 8; ++ib) {
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs + 16 * ib));
    const __m128i lo = _mm_shuffle_epi8(table, _mm_and_si128(q, m4));
    const __m128i hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(q, 4), m4));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(w.code + 32 * ib), _mm_add_epi8(lo, bias));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(w.code + 32 * ib + 16), _mm_add_epi8(hi, bias));
    const int l = b.scales_l[ib / 2] >> (4 * (ib % 2)) & 0xF;
    w.sc[ib] = (l | ((b.scales_h >> (2 * ib)) & 3) << 4) - 32;
  }
}

void unpack_q8_0(const uint8_t* row, int64_t u, WUnit& w) {
  const BlockQ8_0* b = reinterpret_cast<const BlockQ8_0*>(row) + 8 * u;
  const __m256i bias = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int k = 0; k < 8; ++k) {
    w.db[k] = fp16_to_fp32(b[k].d);
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[k].qs));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(w.code + 32 * k), _mm256_add_epi8(q, bias));
  }
}

void unpack_mxfp4(const uint8_t* row, int64_t u, WUnit& w) {
  const BlockMxfp4* b = reinterpret_cast<const BlockMxfp4*>(row) + 8 * u;
  const __m128i table = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kMxfp4Doubled));
  const __m128i m4 = _mm_set1_epi8(0xF), bias = _mm_set1_epi8(static_cast<char>(0x80));
  for (int k = 0; k < 8; ++k) {
    w.db[k] = e8m0_half(b[k].e);
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[k].qs));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(w.code + 32 * k),
                     _mm_add_epi8(_mm_shuffle_epi8(table, _mm_and_si128(q, m4)), bias));
    _mm_storeu_si128(
        reinterpret_cast<__m128i*>(w.code + 32 * k + 16),
        _mm_add_epi8(_mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(q, 4), m4)), bias));
  }
}

template <class A>
A* units_of(A* panel) {  // the panel's first 64-byte boundary
  return reinterpret_cast<A*>((reinterpret_cast<uintptr_t>(panel) + 63) & ~uintptr_t(63));
}

using Unpack = void (*)(const uint8_t*, int64_t, WUnit&);

struct GemmType {
  uint32_t id;
  Unpack unpack;
  Shape shape;
};

const GemmType kGemmTypes[] = {
    {Q4_K, unpack_q4_k, {32, 0, true, false, 1.0f}},
    {Q5_K, unpack_q5_k, {32, 0, true, false, 1.0f}},
    {Q6_K, unpack_q6_k, {16, 32, false, false, 1.0f}},
    {Q2_K, unpack_q2_k, {16, 0, true, false, 1.0f}},
    {Q3_K, unpack_q3_k, {16, 4, false, false, 1.0f}},
    {IQ2_XXS, unpack_iq2_xxs, {32, 128, false, false, 0.125f}},
    {IQ4_XS, unpack_iq4_xs, {32, 128, false, false, 1.0f}},
    {IQ2_XS, unpack_grid<BlockIq2Xs>, {16, 128, false, false, Grid<BlockIq2Xs>::kPost}},
    {IQ2_S, unpack_grid<BlockIq2S>, {16, 128, false, false, Grid<BlockIq2S>::kPost}},
    {IQ3_XXS, unpack_grid<BlockIq3Xxs>, {32, 128, false, false, Grid<BlockIq3Xxs>::kPost}},
    {IQ3_S, unpack_grid<BlockIq3S>, {32, 128, false, false, Grid<BlockIq3S>::kPost}},
    {IQ1_S, unpack_iq1<BlockIq1S>, {32, 128, false, false, 0.125f}},
    {IQ1_M, unpack_iq1<BlockIq1M>, {16, 128, false, false, 0.125f}},
    {Q8_0, unpack_q8_0, {32, 128, false, true, 1.0f}},
    {MXFP4, unpack_mxfp4, {32, 128, false, true, 1.0f}},
};

const GemmType* find(uint32_t wtype) {
  for (const GemmType& g : kGemmTypes)
    if (g.id == wtype) return &g;
  return nullptr;
}

// --- Activations: every 16 tokens' units laid out for the microkernel ---

void lay_out(uint32_t wtype, const uint8_t* xq, size_t xq_row, const int32_t* tok, int64_t n_tokens,
             int64_t cols, AUnit* out) {
  const int64_t units = cols / kUnit, groups = (n_tokens + kLanes - 1) / kLanes;
  const bool q8k = vec_dot_type(wtype) == Q8_K;
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t u = 0; u < units; ++u) {
      AUnit& a = out[g * units + u];
      std::memset(&a, 0, sizeof a);
      for (int t = 0; t < kLanes && g * kLanes + t < n_tokens; ++t) {
        const int64_t i = g * kLanes + t;
        const uint8_t* x = xq + (tok ? tok[i] : i) * xq_row;
        const int8_t* qs;
        if (q8k) {
          const BlockQ8K& b = reinterpret_cast<const BlockQ8K*>(x)[u];
          qs = b.qs;
          a.yd[0][t] = b.d;
          for (int s = 0; s < 16; ++s) a.sum16[s][t] = b.bsums[s];
          for (int k4 = 0; k4 < kUnit / 4; ++k4) std::memcpy(a.q[k4][t], qs + 4 * k4, 4);
        } else {
          const BlockQ8_0* b = reinterpret_cast<const BlockQ8_0*>(x) + 8 * u;
          for (int k = 0; k < 8; ++k) {
            a.yd[k][t] = fp16_to_fp32(b[k].d);
            for (int h = 0; h < 2; ++h) {
              int s = 0;
              for (int i2 = 0; i2 < 16; ++i2) s += b[k].qs[16 * h + i2];
              a.sum16[2 * k + h][t] = s;
            }
            for (int k4 = 0; k4 < 8; ++k4) std::memcpy(a.q[8 * k + k4][t], b[k].qs + 4 * k4, 4);
          }
        }
      }
    }
}

// --- The microkernel: 8 rows x 16 tokens x one unit ---
// Over the 16 token lanes of a zmm (Z16), or the first 8 of them in a ymm (Z8: a group of at most
// 8 tokens, as the last of an expert's share of a prefill often is, at half the work where a
// 512-bit instruction is two 256-bit halves). Each lane's steps are the same in both.

struct Z16 {
  using I = __m512i;
  using F = __m512;
  static I zero() { return _mm512_setzero_si512(); }
  static F zerof() { return _mm512_setzero_ps(); }
  static I load(const void* p) { return _mm512_load_si512(p); }
  static F loadf(const float* p) { return _mm512_load_ps(p); }
  static I dpbusd(I c, int32_t w, I a) { return _mm512_dpbusd_epi32(c, _mm512_set1_epi32(w), a); }
  static I add(I a, I b) { return _mm512_add_epi32(a, b); }
  static I sub(I a, I b) { return _mm512_sub_epi32(a, b); }
  template <int kShift>
  static I shl(I a) {
    return _mm512_slli_epi32(a, kShift);
  }
  static I mullo(I a, int32_t b) { return _mm512_mullo_epi32(a, _mm512_set1_epi32(b)); }
  static F cvt(I a) { return _mm512_cvtepi32_ps(a); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F mul(float a, F b) { return _mm512_mul_ps(_mm512_set1_ps(a), b); }
  static F addf(F a, F b) { return _mm512_add_ps(a, b); }
  static F subf(F a, F b) { return _mm512_sub_ps(a, b); }
};

struct Z8 {
  using I = __m256i;
  using F = __m256;
  static I zero() { return _mm256_setzero_si256(); }
  static F zerof() { return _mm256_setzero_ps(); }
  static I load(const void* p) { return _mm256_load_si256(static_cast<const __m256i*>(p)); }
  static F loadf(const float* p) { return _mm256_load_ps(p); }
  static I dpbusd(I c, int32_t w, I a) { return _mm256_dpbusd_epi32(c, _mm256_set1_epi32(w), a); }
  static I add(I a, I b) { return _mm256_add_epi32(a, b); }
  static I sub(I a, I b) { return _mm256_sub_epi32(a, b); }
  template <int kShift>
  static I shl(I a) {
    return _mm256_slli_epi32(a, kShift);
  }
  static I mullo(I a, int32_t b) { return _mm256_mullo_epi32(a, _mm256_set1_epi32(b)); }
  static F cvt(I a) { return _mm256_cvtepi32_ps(a); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F mul(float a, F b) { return _mm256_mul_ps(_mm256_set1_ps(a), b); }
  static F addf(F a, F b) { return _mm256_add_ps(a, b); }
  static F subf(F a, F b) { return _mm256_sub_ps(a, b); }
};

template <class V, int kSub, int kBias, bool kMins, bool kBlock32>
void micro(const WUnit* w, const AUnit& a, int l, typename V::F* acc) {
  using I = typename V::I;
  using F = typename V::F;
  constexpr int kNs = kUnit / kSub, kSteps = kSub / 4;
  I isum[kRows], msum[kRows];
  if constexpr (!kBlock32)
    for (int r = 0; r < kRows; ++r) isum[r] = msum[r] = V::zero();
  for (int s = 0; s < kNs; ++s) {
    I c[kRows];
    for (int r = 0; r < kRows; ++r) c[r] = V::zero();
    for (int k = 0; k < kSteps; ++k) {
      const int k4 = s * kSteps + k;
      const I av = V::load(a.q[k4]);
      for (int r = 0; r < kRows; ++r) {
        int32_t w4;
        std::memcpy(&w4, w[r].code + 4 * k4, 4);
        c[r] = V::dpbusd(c[r], w4, av);
      }
    }
    I q = V::load(a.sum16[kSub == 16 ? s : 2 * s]);
    if constexpr (kSub == 32) q = V::add(q, V::load(a.sum16[2 * s + 1]));
    const I bq = V::template shl < kBias == 128 ? 7 : kBias == 32 ? 5 : 2 > (q);
    for (int r = 0; r < kRows; ++r) {
      const I cr = kBias ? V::sub(c[r], bq) : c[r];
      if constexpr (kBlock32) {  // block s goes to the row's float lane s (the tiles' order)
        const F t = V::mul(w[r].db[s], V::loadf(a.yd[s]));
        acc[8 * r + s] = V::addf(acc[8 * r + s], V::mul(t, V::cvt(cr)));
      } else {
        isum[r] = V::add(isum[r], V::mullo(cr, w[r].sc[s]));
        if constexpr (kMins) msum[r] = V::add(msum[r], V::mullo(q, w[r].mn[s]));
      }
    }
  }
  if constexpr (!kBlock32) {
    const F yd = V::loadf(a.yd[0]);
    for (int r = 0; r < kRows; ++r) {  // into the row's float lane l (sb_lanes' arithmetic)
      F& lane = acc[8 * r + l];
      const F t = V::mul(w[r].d, yd);
      lane = V::addf(lane, V::mul(t, V::cvt(isum[r])));
      if constexpr (kMins) {
        const F tm = V::mul(w[r].dmin, yd);
        lane = V::subf(lane, V::mul(tm, V::cvt(msum[r])));
      }
    }
  }
}

template <class V>
using Micro = void (*)(const WUnit*, const AUnit&, int, typename V::F*);

template <class V>
Micro<V> micro_for(const Shape& s) {
  if (s.block32) return micro<V, 32, 128, false, true>;
  if (s.sub == 32) {
    if (s.mins) return micro<V, 32, 0, true, false>;
    return micro<V, 32, 128, false, false>;  // IQ2_XXS, IQ4_XS, IQ3_XXS, IQ3_S, IQ1_S
  }
  if (s.mins) return micro<V, 16, 0, true, false>;            // Q2_K
  if (s.bias == 128) return micro<V, 16, 128, false, false>;  // IQ2_XS, IQ2_S, IQ1_M
  if (s.bias == 32) return micro<V, 16, 32, false, false>;    // Q6_K
  return micro<V, 16, 4, false, false>;                       // Q3_K
}

// F16 and BF16 (gemm_float.h): the activations as avx512.cpp's dots widen them, F16's in order,
// BF16's each 32 elements' even ones (shifted left 16) then its odd ones (low halves cleared);
// two rows against four tokens a pass, each (row, token) in the dot's two registers of chains.
void float_lay_out(uint32_t wtype, const uint8_t* xq, size_t xq_row, const int32_t* tok,
                   int64_t n_tokens, int64_t cols, float* out) {
  const __m512i hi = _mm512_set1_epi32(int(0xFFFF0000u));
  for (int64_t i = 0; i < n_tokens; ++i) {
    const uint16_t* x = reinterpret_cast<const uint16_t*>(xq + (tok ? tok[i] : i) * xq_row);
    float* o = out + i * cols;
    for (int64_t j = 0; j < cols; j += 32)
      if (wtype == F16) {
        _mm512_storeu_ps(
            o + j, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + j))));
        _mm512_storeu_ps(
            o + j + 16,
            _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + j + 16))));
      } else {
        const __m512i v = _mm512_loadu_si512(x + j);
        _mm512_storeu_ps(o + j, _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));
        _mm512_storeu_ps(o + j + 16, _mm512_castsi512_ps(_mm512_and_si512(v, hi)));
      }
  }
}

template <uint32_t T, int R, int N>
__attribute__((always_inline)) inline void float_pass(const uint16_t* w, int64_t cols,
                                                      const float* const* xs, float (*out)[4]) {
  const __m512i hi = _mm512_set1_epi32(int(0xFFFF0000u));
  __m512 acc[R][N][2];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < N; ++t) acc[r][t][0] = acc[r][t][1] = _mm512_setzero_ps();
  for (int64_t j = 0; j < cols; j += 32) {
    __m512 wv[R][2];
    for (int r = 0; r < R; ++r) {
      const uint16_t* p = w + r * cols + j;
      if constexpr (T == F16) {
        wv[r][0] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
        wv[r][1] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16)));
      } else {
        const __m512i v = _mm512_loadu_si512(p);
        wv[r][0] = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
        wv[r][1] = _mm512_castsi512_ps(_mm512_and_si512(v, hi));
      }
    }
    for (int t = 0; t < N; ++t) {
      const __m512 x0 = _mm512_loadu_ps(xs[t] + j), x1 = _mm512_loadu_ps(xs[t] + j + 16);
      for (int r = 0; r < R; ++r) {
        acc[r][t][0] = _mm512_fmadd_ps(wv[r][0], x0, acc[r][t][0]);
        acc[r][t][1] = _mm512_fmadd_ps(wv[r][1], x1, acc[r][t][1]);
      }
    }
  }
  auto halves = [](__m512 v) {
    return _mm256_add_ps(_mm512_castps512_ps256(v),
                         _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  };
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < N; ++t)
      out[r][t] = T == F16 ? x86::hsum(_mm256_add_ps(halves(acc[r][t][0]), halves(acc[r][t][1])))
                           : x86::hsum(halves(_mm512_add_ps(acc[r][t][0], acc[r][t][1])));
}

template <uint32_t T>
void float_rows(const void* w, int64_t rows, int64_t cols, int64_t r0, int64_t r1,
                const float* panel, int64_t n_tokens, float* y) {
  x86::float_rows<2, 4>(
      static_cast<const uint16_t*>(w), rows, cols, r0, r1, panel, n_tokens, y,
      [&](int nr, int nt, const uint16_t* wr, const float* const* xs, float(*out)[4]) {
        x86::with_n(nt, [&](auto n) {
          if (nr == 2)
            float_pass<T, 2, n>(wr, cols, xs, out);
          else
            float_pass<T, 1, n>(wr, cols, xs, out);
        });
      });
}

}  // namespace

bool gemm_supported(uint32_t wtype) {
  return x86::float_panel_type(wtype) || find(wtype) != nullptr;
}

size_t gemm_act_bytes(uint32_t wtype, int64_t cols, int64_t n_tokens) {
  if (x86::float_panel_type(wtype)) return x86::float_panel_bytes(cols, n_tokens);
  return size_t((n_tokens + kLanes - 1) / kLanes) * size_t(cols / kUnit) * sizeof(AUnit) + 64;
}

void gemm_lay_out(uint32_t wtype, const uint8_t* xq, size_t xq_row, const int32_t* tok,
                  int64_t n_tokens, int64_t cols, uint8_t* panel) {
  if (x86::float_panel_type(wtype))
    return float_lay_out(wtype, xq, xq_row, tok, n_tokens, cols, x86::float_panel(panel));
  lay_out(wtype, xq, xq_row, tok, n_tokens, cols, units_of(reinterpret_cast<AUnit*>(panel)));
}

void gemm_rows(uint32_t wtype, const void* w, int64_t rows, int64_t cols, int64_t r0, int64_t r1,
               const uint8_t* panel, int64_t n_tokens, float* y) {
  if (x86::float_panel_type(wtype)) {
    const float* x = x86::float_panel(panel);
    return wtype == F16 ? float_rows<F16>(w, rows, cols, r0, r1, x, n_tokens, y)
                        : float_rows<BF16>(w, rows, cols, r0, r1, x, n_tokens, y);
  }
  const GemmType& g = *find(wtype);
  const Micro<Z16> mk = micro_for<Z16>(g.shape);
  const Micro<Z8> mk8 = micro_for<Z8>(g.shape);
  const int64_t units = cols / kUnit;
  const size_t w_row = row_size(wtype, cols);
  const AUnit* act = units_of(reinterpret_cast<const AUnit*>(panel));
  x86::drive_rows<kRows, kLanes, WUnit>(
      units, n_tokens, rows, r0, r1, static_cast<const uint8_t*>(w), w_row,
      [&](int64_t row, int64_t u, WUnit& wu) {
        g.unpack(static_cast<const uint8_t*>(w) + row * w_row, u, wu);
      },
      [](WUnit& wu) {
        std::memset(wu.code, 0, sizeof wu.code);
        std::memset(wu.sc, 0, sizeof wu.sc), std::memset(wu.mn, 0, sizeof wu.mn);
        wu.d = wu.dmin = 0;
        std::memset(wu.db, 0, sizeof wu.db);
      },
      [&](const WUnit* wp, int64_t gi, float(*out)[kLanes]) {
        auto run = [&]<class V>(V, Micro<V> m, auto store) {
          // 8 float lanes per row: block (or super-block) b in lane b % 8
          typename V::F acc[kRows * 8];
          for (auto& v : acc) v = V::zerof();
          for (int64_t u = 0; u < units; ++u)
            m(&wp[size_t(u) * kRows], act[gi * units + u], int(u % 8), acc);
          for (int r = 0; r < kRows; ++r) {  // x86::hsum's order of the 8 lanes
            const auto* a8 = acc + 8 * r;
            const auto v = V::addf(V::addf(V::addf(a8[0], a8[4]), V::addf(a8[2], a8[6])),
                                   V::addf(V::addf(a8[1], a8[5]), V::addf(a8[3], a8[7])));
            store(out[r], g.shape.post == 1.0f ? v : V::mul(g.shape.post, v));
          }
        };
        if (n_tokens - gi * kLanes <= 8)
          run(Z8{}, mk8, [](float* o, __m256 v) { _mm256_store_ps(o, v); });
        else
          run(Z16{}, mk, [](float* o, __m512 v) { _mm512_store_ps(o, v); });
      },
      y);
}

}  // namespace kernels::avx512
