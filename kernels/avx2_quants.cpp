// The AVX2 bodies of the legacy 32-element blocks beyond Q8_0/Q5_0/MXFP4, the low-bit K-quants,
// the ternary and the IQ types (compile flags in CMakeLists.txt; split from avx2.cpp).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>

#include "kernels/avx2.h"
#include "kernels/fp16.h"
#include "kernels/iq_grids.h"
#include "kernels/isa.h"
#include "kernels/kernels.h"
#include "kernels/x86.h"

// --- The types of the weight-types issue ---
// The 32-element blocks accumulate in eight float lanes as llama.cpp's AVX2 code does (its
// rounding); the K and IQ types sum each super-block's integers exactly, then scale them in float
// lanes (IQ4_XS and the grid IQ types: sb_lanes' order, avx2.h, which their matrix-matrix panels
// share).

#include "kernels/dequant.h"

namespace kernels::avx2 {
namespace {
inline __m256i nibbles(const uint8_t* p) {  // 16 bytes -> low nibbles (0..15), high (16..31)
  const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), _mm256_set1_epi8(0xF));
}
inline __m256i madd_u8(__m256i u, __m256i s) {  // unsigned x signed bytes, summed in i32 lanes
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}
// The 16 sub-block scales of a super-block (int8, one per 16 elements) as i16 madd multipliers:
// pairs(k) is group k's (elements 32k .. 32k + 31: scale 2k in the low lane, 2k + 1 in the high).
struct ScalePairs {
  __m256i half[2];
  explicit ScalePairs(__m128i s8) {
    const __m256i all = _mm256_cvtepi8_epi16(s8);
    const __m128i l = _mm256_castsi256_si128(all), h = _mm256_extracti128_si256(all, 1);
    half[0] = _mm256_set_m128i(l, l);
    half[1] = _mm256_set_m128i(h, h);
  }
  __m256i operator()(int k) const {
    alignas(32) static const uint8_t kShuf[4][32] = {
        {0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
         2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3},
        {4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5,
         6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7},
        {8,  9,  8,  9,  8,  9,  8,  9,  8,  9,  8,  9,  8,  9,  8,  9,
         10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11},
        {12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13,
         14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15}};
    const __m256i shuf = _mm256_load_si256(reinterpret_cast<const __m256i*>(kShuf[k % 4]));
    return _mm256_shuffle_epi8(half[k / 4], shuf);
  }
};
// Signed weights x activations in i16 pairs, times the i16 multipliers `scale`, in i32 lanes.
inline __m256i mul_by(__m256i w, __m256i q, __m256i scale) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(q, w)),
                           scale);
}
using x86::hsum_i32;
}  // namespace

float dot_q4_0(const BlockQ4_0* x, const BlockQ8_0* y, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / 32; ++b) {
    const __m256i w = _mm256_sub_epi8(nibbles(x[b].qs), _mm256_set1_epi8(8));
    const __m256 d = _mm256_set1_ps(fp16_to_fp32(x[b].d) * fp16_to_fp32(y[b].d));
    acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(mul_sum_i8(w, load(y[b].qs))), acc);
  }
  return hsum(acc);
}

// Q4_1 / Q5_1: unsigned quants against Q8_1; the mins meet the activations' sums s.
template <bool kFive>
float dot_q51(const uint8_t* blocks, size_t stride, const BlockQ8_1* y, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  float summs = 0, sum = 0;
  for (int64_t b = 0; b < n / 32; ++b) {
    const uint8_t* blk = blocks + b * stride;
    uint16_t hd, hm;
    std::memcpy(&hd, blk, 2);
    std::memcpy(&hm, blk + 2, 2);
    const float d0 = fp16_to_fp32(hd), d1 = fp16_to_fp32(y[b].d);
    __m256i w = nibbles(blk + (kFive ? 8 : 4));
    if (kFive) {
      uint32_t qh;
      std::memcpy(&qh, blk + 4, 4);
      const __m256i hb = x86::bytes_where_set(qh);
      w = _mm256_or_si256(w, _mm256_and_si256(hb, _mm256_set1_epi8(16)));
    }
    if (kFive) {  // Q5_1: the reference's order, one exact sum per block (as llama.cpp rounds it)
      sum += (d0 * d1) * static_cast<float>(hsum_i32(madd_u8(w, load(y[b].qs)))) +
             fp16_to_fp32(hm) * fp16_to_fp32(y[b].s);
      continue;
    }
    summs += fp16_to_fp32(hm) * fp16_to_fp32(y[b].s);
    const __m256 xy = _mm256_cvtepi32_ps(madd_u8(w, load(y[b].qs)));
    acc = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(d0), _mm256_set1_ps(d1)), xy, acc);
  }
  return kFive ? sum : hsum(acc) + summs;
}
float dot_q4_1(const BlockQ4_1* x, const BlockQ8_1* y, int64_t n) {
  return dot_q51<false>(reinterpret_cast<const uint8_t*>(x), sizeof(BlockQ4_1), y, n);
}
float dot_q5_1(const BlockQ5_1* x, const BlockQ8_1* y, int64_t n) {
  return dot_q51<true>(reinterpret_cast<const uint8_t*>(x), sizeof(BlockQ5_1), y, n);
}

float dot_iq4_nl(const BlockIq4Nl* x, const BlockQ8_0* y, int64_t n) {
  const __m256i table = _mm256_broadcastsi128_si256(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(iq::kvalues_iq4nl)));
  float s = 0;  // the reference's order, one exact sum per block (as llama.cpp rounds it)
  for (int64_t b = 0; b < n / 32; ++b) {
    const __m256i w = _mm256_shuffle_epi8(table, nibbles(x[b].qs));
    s += (fp16_to_fp32(y[b].d) * fp16_to_fp32(x[b].d)) *
         static_cast<float>(hsum_i32(mul_sum_i8(w, load(y[b].qs))));
  }
  return s;
}

template <int N>
void q2k_rows(const BlockQ2K* x, const BlockQ8K* const* ys, int64_t n, float* out) {
  const __m256i m3 = _mm256_set1_epi8(3);
  const __m128i m4 = _mm_set1_epi8(0xF);
  sb_rows<N, true>(
      x, sizeof(BlockQ2K), offsetof(BlockQ2K, d), offsetof(BlockQ2K, dmin), n, ys, 1.0f, out,
      [&](int64_t b, __m256i* I, __m256i* M) {
        // Mins against the 16-element sums of the activations: 16 products in one madd.
        const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x[b].scales));
        const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc8, 4), m4));
        const ScalePairs sc(_mm_and_si128(sc8, m4));
        for (int t = 0; t < N; ++t) M[t] = _mm256_madd_epi16(mins, load(ys[t][b].bsums));
        for (int h = 0; h < 2; ++h) {
          const __m256i q2 = load(x[b].qs + 32 * h);
          for (int j = 0; j < 4; ++j) {
            const __m256i q = _mm256_and_si256(_mm256_srli_epi16(q2, 2 * j), m3);
            const __m256i scale = sc(4 * h + j);
            for (int t = 0; t < N; ++t)
              I[t] = _mm256_add_epi32(
                  I[t], _mm256_madd_epi16(
                            _mm256_maddubs_epi16(q, load(ys[t][b].qs + 32 * (4 * h + j))), scale));
          }
        }
      });
}
EXPERTD_ROWS_KERNEL(q2_k, BlockQ2K, BlockQ8K, q2k_rows)

template <int N>
void q3k_rows(const BlockQ3K* x, const BlockQ8K* const* ys, int64_t n, float* out) {
  // sum (u - 4) q8 with u = q | high bit << 2 in 0..7 (maddubs-ready) = sum u q8 - 4 sum q8, the
  // second from the activations' 16-element sums: no sign ops in the loop.
  const __m256i m3 = _mm256_set1_epi8(3), m4 = _mm256_set1_epi8(4);
  sb_rows<N, false>(
      x, sizeof(BlockQ3K), offsetof(BlockQ3K, d), 0, n, ys, 1.0f, out,
      [&](int64_t b, __m256i* I, __m256i*) {
        const __m128i s8 = x86::q3k_scales(x[b].scales);
        const ScalePairs sc(s8);
        const __m256i s16 = _mm256_cvtepi8_epi16(s8);
        const __m256i hm = load(x[b].hmask);
        for (int h = 0; h < 2; ++h) {
          const __m256i q3 = load(x[b].qs + 32 * h);
          for (int j = 0; j < 4; ++j) {
            const int k = 4 * h + j;
            const __m256i q = _mm256_and_si256(_mm256_srli_epi16(q3, 2 * j), m3);
            const __m256i hb = k >= 2 ? _mm256_srli_epi16(hm, k - 2) : _mm256_slli_epi16(hm, 2 - k);
            const __m256i u = _mm256_or_si256(q, _mm256_and_si256(hb, m4));
            const __m256i scale = sc(k);
            for (int t = 0; t < N; ++t)
              I[t] = _mm256_add_epi32(
                  I[t],
                  _mm256_madd_epi16(_mm256_maddubs_epi16(u, load(ys[t][b].qs + 32 * k)), scale));
          }
        }
        for (int t = 0; t < N; ++t)
          I[t] = _mm256_sub_epi32(
              I[t], _mm256_slli_epi32(_mm256_madd_epi16(s16, load(ys[t][b].bsums)), 2));
      });
}
EXPERTD_ROWS_KERNEL(q3_k, BlockQ3K, BlockQ8K, q3k_rows)

template <int N>
void iq2xxs_rows(const BlockIq2Xxs* x, const BlockQ8K* const* ys, int64_t n, float* out) {
  sb_rows<N, false>(
      x, sizeof(BlockIq2Xxs), 0, 0, n, ys, 0.125f, out, [&](int64_t b, __m256i* I, __m256i*) {
        const uint8_t* q = reinterpret_cast<const uint8_t*>(x[b].qs);
        for (int ib = 0; ib < 8; ++ib, q += 8) {
          uint32_t aux;
          std::memcpy(&aux, q + 4, 4);
          const __m256i g = x86::iq2xxs_grid(q);
          const __m256i sg = grid4(kSigns.v[aux & 127], kSigns.v[(aux >> 7) & 127],
                                   kSigns.v[(aux >> 14) & 127], kSigns.v[(aux >> 21) & 127]);
          const __m256i ls = _mm256_set1_epi16(int16_t(2 * (aux >> 28) + 1));
          for (int t = 0; t < N; ++t) {
            const __m256i q8 = _mm256_sign_epi8(load(ys[t][b].qs + 32 * ib), sg);
            I[t] = _mm256_add_epi32(I[t], _mm256_madd_epi16(_mm256_maddubs_epi16(g, q8), ls));
          }
        }
      });
}
EXPERTD_ROWS_KERNEL(iq2_xxs, BlockIq2Xxs, BlockQ8K, iq2xxs_rows)

inline __m256i two_scales16(int s0, int s1) {
  return _mm256_setr_m128i(_mm_set1_epi16(int16_t(s0)), _mm_set1_epi16(int16_t(s1)));
}

// IQ1_S and IQ1_M (iq_grids.h): group(b, ib, grid8, s0, s1, off) gives group ib's u (unsigned,
// <= 18), its scales, and off, the factors of its two 16-element activation sums, such that u
// against the activations plus off against those sums is the exact sum of 8 x value x activation
// (IQ1_S: u = 8 (grid + 1), its delta and the bias 8 in off; IQ1_M: u = 8 (grid + 1) + 8 (delta +
// 1/8), the bias 9 in off). u by vpmaddubsw (pairs <= 2 x 18 x 127), times the scales: each
// super-block's exact sum of scale x 8 value x activation (post 0.125).

template <int N, class Block, class Group>
__attribute__((always_inline)) inline void iq1_rows(const Block* x, const BlockQ8K* const* ys,
                                                    int64_t n, float* out, const Group& group) {
  const uint64_t* grid8 = iq1_grid8();
  sb_rows_dx<N, false>(
      x, sizeof(Block), 0, n, ys, 0.125f, out,
      [&](int64_t b, __m256i* I, __m256i*) {
        alignas(32) int16_t off[16];  // each 16 elements' activation sum's factor
#pragma GCC unroll 8
        for (int ib = 0; ib < 8; ++ib) {
          int s0, s1;
          const __m256i u = group(x[b], ib, grid8, s0, s1, off + 2 * ib);
          const __m256i scale =
              Iq1<Block>::kSub == 32 ? _mm256_set1_epi16(int16_t(s0)) : two_scales16(s0, s1);
          for (int t = 0; t < N; ++t)
            I[t] = _mm256_add_epi32(
                I[t],
                _mm256_madd_epi16(_mm256_maddubs_epi16(u, load(ys[t][b].qs + 32 * ib)), scale));
        }
        const __m256i o16 = load(off);
        for (int t = 0; t < N; ++t)
          I[t] = _mm256_add_epi32(I[t], _mm256_madd_epi16(o16, load(ys[t][b].bsums)));
      },
      iq1_d8<Block>);
}
template <int N>
void iq1s_rows(const BlockIq1S* x, const BlockQ8K* const* ys, int64_t n, float* out) {
  if (!gathers_slow()) return tile_iq1_s_gather(x, ys, N, n, out);
  iq1_rows<N>(x, ys, n, out,
              [](const BlockIq1S& b, int ib, const uint64_t* g, int& s0, int& s1, int16_t* off) {
                return iq1s_tile_group(b, ib, g, s0, s1, off);
              });
}
template <int N>
void iq1m_rows(const BlockIq1M* x, const BlockQ8K* const* ys, int64_t n, float* out) {
  if (!gathers_slow()) return tile_iq1_m_gather(x, ys, N, n, out);
  const DeltaRow* deltas = iq1m_deltas();
  iq1_rows<N>(
      x, ys, n, out,
      [deltas](const BlockIq1M& b, int ib, const uint64_t* g, int& s0, int& s1, int16_t* off) {
        return iq1m_tile_group<false>(b, ib, g, deltas, s0, s1, off);
      });
}
EXPERTD_ROWS_KERNEL(iq1_s, BlockIq1S, BlockQ8K, iq1s_rows)
EXPERTD_ROWS_KERNEL(iq1_m, BlockIq1M, BlockQ8K, iq1m_rows)

template <int N>
void iq4xs_rows(const BlockIq4Xs* x, const BlockQ8K* const* ys, int64_t n, float* out) {
  const __m256i table = _mm256_broadcastsi128_si256(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(iq::kvalues_iq4nl)));
  const __m256i m4 = _mm256_set1_epi8(0xF);
  sb_rows<N, false>(
      x, sizeof(BlockIq4Xs), 0, 0, n, ys, 1.0f, out, [&](int64_t b, __m256i* I, __m256i*) {
        uint16_t sh = x[b].scales_h;
        const uint8_t* qs = x[b].qs;
        for (int ib = 0; ib < 8; ib += 2, qs += 32, sh >>= 4) {  // two groups of 32
          const __m256i q = load(qs);  // group ib: bytes 0..15, group ib + 1: 16..31
          const __m256i lo = _mm256_and_si256(q, m4),
                        hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
          const __m256i w1 = _mm256_shuffle_epi8(table, _mm256_permute2x128_si256(lo, hi, 0x20));
          const __m256i w2 = _mm256_shuffle_epi8(table, _mm256_permute2x128_si256(lo, hi, 0x31));
          const __m256i a1 = _mm256_sign_epi8(w1, w1), a2 = _mm256_sign_epi8(w2, w2);
          const int ls1 = ((x[b].scales_l[ib / 2] & 0xf) | ((sh << 4) & 0x30)) - 32;
          const int ls2 = ((x[b].scales_l[ib / 2] >> 4) | ((sh << 2) & 0x30)) - 32;
          const __m256i s1 = _mm256_set1_epi16(int16_t(ls1)), s2 = _mm256_set1_epi16(int16_t(ls2));
          for (int t = 0; t < N; ++t) {
            const int8_t* q8 = ys[t][b].qs + 32 * ib;
            I[t] = _mm256_add_epi32(
                I[t],
                _mm256_madd_epi16(_mm256_maddubs_epi16(a1, _mm256_sign_epi8(load(q8), w1)), s1));
            I[t] = _mm256_add_epi32(
                I[t], _mm256_madd_epi16(
                          _mm256_maddubs_epi16(a2, _mm256_sign_epi8(load(q8 + 32), w2)), s2));
          }
        }
      });
}
EXPERTD_ROWS_KERNEL(iq4_xs, BlockIq4Xs, BlockQ8K, iq4xs_rows)

}  // namespace kernels::avx2

namespace kernels::avx2 {
namespace {
// Byte -> four 2-bit fields minus one, as int8 (Q2_0), and byte -> eight bits as +1 / -1 (Q1_0).
struct LowBitTables {
  uint32_t q2[256];
  uint64_t q1[256];
  LowBitTables() {
    for (int b = 0; b < 256; ++b) {
      q2[b] = 0;
      q1[b] = 0;
      for (int i = 0; i < 4; ++i) q2[b] |= uint32_t(uint8_t(((b >> (2 * i)) & 3) - 1)) << (8 * i);
      for (int i = 0; i < 8; ++i) q1[b] |= uint64_t(b >> i & 1 ? 0x01 : 0xFF) << (8 * i);
    }
  }
};
const LowBitTables kLow;
}  // namespace

// The reference's order: one exact integer sum per Q8_0 block, scaled in scalar.
float dot_q2_0(const BlockQ2_0* x, const BlockQ8_0* y, int64_t n) {
  float s = 0;
  for (int64_t b = 0; b < n / 64; ++b) {
    float sumi = 0;
    for (int k = 0; k < 2; ++k) {
      const uint8_t* q = x[b].qs + 8 * k;
      const __m256i w = _mm256_setr_epi32(
          int(kLow.q2[q[0]]), int(kLow.q2[q[1]]), int(kLow.q2[q[2]]), int(kLow.q2[q[3]]),
          int(kLow.q2[q[4]]), int(kLow.q2[q[5]]), int(kLow.q2[q[6]]), int(kLow.q2[q[7]]));
      const BlockQ8_0& yb = y[2 * b + k];
      sumi += fp16_to_fp32(yb.d) * static_cast<float>(hsum_i32(mul_sum_i8(w, load(yb.qs))));
    }
    s += fp16_to_fp32(x[b].d) * sumi;
  }
  return s;
}

float dot_q1_0(const BlockQ1_0* x, const BlockQ8_0* y, int64_t n) {
  // llama.cpp's structure: each bit picks +q8 or -q8 (xor and subtract with the compare mask),
  // summed per Q8_0 block, scaled in eight lanes per block of 128, then by the block's d.
  const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / 128; ++b) {
    __m256 blk = _mm256_setzero_ps();
    for (int k = 0; k < 4; ++k) {
      uint32_t q;
      std::memcpy(&q, x[b].qs + 4 * k, 4);
      const __m256i zero_bit = x86::bytes_where_clear(q);
      const __m256i qy = load(y[4 * b + k].qs);
      const __m256i sy = _mm256_sub_epi8(_mm256_xor_si256(qy, zero_bit), zero_bit);
      const __m256i s32 = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, sy), ones16);
      const __m256 dy = _mm256_set1_ps(fp16_to_fp32(y[4 * b + k].d));
      blk = k == 0 ? _mm256_mul_ps(dy, _mm256_cvtepi32_ps(s32))
                   : _mm256_fmadd_ps(dy, _mm256_cvtepi32_ps(s32), blk);
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16_to_fp32(x[b].d)), blk, acc);
  }
  return hsum(acc);
}

float dot_tq2_0(const BlockTq2_0* x, const BlockQ8K* y, int64_t n) {
  // llama.cpp's structure: q in 0..2 (maddubs-ready) summed in i16 (256 x 127 fits), minus the
  // activations' sums for the -1, then scaled in eight lanes.
  __m256 acc = _mm256_setzero_ps();
  const __m256i m3 = _mm256_set1_epi8(3);
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    x86::prefetch_ahead(x + b);
    x86::prefetch_ahead(reinterpret_cast<const uint8_t*>(x + b) + 64);
    __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
    for (int j = 0; j < 2; ++j) {
      const __m256i q = load(x[b].qs + 32 * j);
      const int8_t* q8 = y[b].qs + 128 * j;
      const __m256i p0 = _mm256_maddubs_epi16(_mm256_and_si256(q, m3), load(q8));
      const __m256i p1 =
          _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(q, 2), m3), load(q8 + 32));
      const __m256i p2 =
          _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(q, 4), m3), load(q8 + 64));
      const __m256i p3 =
          _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(q, 6), m3), load(q8 + 96));
      s0 = _mm256_add_epi16(s0, _mm256_add_epi16(p0, p1));
      s1 = _mm256_add_epi16(s1, _mm256_add_epi16(p2, p3));
    }
    const __m256i v = _mm256_sub_epi16(_mm256_add_epi16(s0, s1), load(y[b].bsums));
    const __m256 d = _mm256_set1_ps(y[b].d * fp16_to_fp32(x[b].d));
    acc = _mm256_add_ps(
        _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(v, _mm256_set1_epi16(1))), d), acc);
  }
  return hsum(acc);
}

namespace {
struct NvfpMaddubs {  // x86.h's nvfp4_rows' 4-element sums: vpmaddubsw + vpmaddwd
  static __m256i dot(__m256i aw, __m256i sy) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sy), _mm256_set1_epi16(1));
  }
};
}  // namespace

float dot_nvfp4(const BlockNvfp4* x, const BlockQ8_0* y, int64_t n) {
  float r;
  x86::nvfp4_rows<NvfpMaddubs, 1>(x, &y, n, &r);
  return r;
}

void tile_nvfp4(const BlockNvfp4* x, const BlockQ8_0* const* ys, int n_tok, int64_t n, float* out) {
  x86::with_n(n_tok, [&](auto N) { x86::nvfp4_rows<NvfpMaddubs, N>(x, ys, n, out); });
}

}  // namespace kernels::avx2

namespace kernels::avx2 {
namespace {
// A * 3 mod 256 in every byte (two byte adds).
inline __m256i times3(__m256i a) {
  return _mm256_add_epi8(_mm256_add_epi8(a, a), a);
}

// TQ1_0: weight e is base-3 digit n of its byte, digit = ((uint8_t)(byte * 3^n) * 3) >> 8, i.e.
// 0, 1 or 2 as (uint8_t)(byte * 3^n) is below 86, below 171, or not. Each ymm's 32 such products
// come from the one before by byte adds (x ^ 0x80 obeys the same recurrence, so the products are
// made biased and compared signed); the digits meet the activations by vpmaddubsw, summed in 16
// bits with the activations' block sums taken off (|sum| <= 6144), one exact integer a
// super-block scaled as the reference does: its bits. Eight ymm a super-block, in element order:
// digits 0-4 of qs[0..32); digits 0, 1 | 2, 3 of qs[32..48); digit 4 of qs[32..48) with qh's
// digits 0-3 in its four bytes' dwords.
template <int N>
void tq1_0_rows(const BlockTq1_0* x, const BlockQ8K* const* ys, int64_t n, float* out) {
  const __m256i bias = _mm256_set1_epi8(char(0x80));
  const __m256i lo1 = _mm256_set1_epi8(85 - 128), lo2 = _mm256_set1_epi8(170 - 128);
  float s[N] = {};
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    x86::prefetch_ahead(x + b);
    x86::prefetch_ahead(reinterpret_cast<const uint8_t*>(x + b) + 64);
    const uint8_t* q = x[b].qs;
    __m256i v[8];
    v[0] = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)), bias);
    for (int k = 1; k < 5; ++k) v[k] = times3(v[k - 1]);
    const __m256i r = _mm256_xor_si256(
        _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 32))),
        bias);
    v[5] = _mm256_blend_epi32(r, times3(r), 0xF0);  // digits 0 | 1 of qs[32..48)
    v[6] = times3(times3(v[5]));                    // digits 2 | 3
    uint32_t qh;
    std::memcpy(&qh, x[b].qh, 4);
    // digit 2 of qs[32..48) | qh; then x3, x9, x27: digit 4 below, qh's digits 0-3 above.
    const __m256i h0 =
        _mm256_blend_epi32(v[6], _mm256_set1_epi32(static_cast<int>(qh ^ 0x80808080u)), 0xF0);
    const __m256i h1 = times3(h0), h2 = times3(h1), h3 = times3(h2);
    v[7] = _mm256_blend_epi32(_mm256_blend_epi32(_mm256_blend_epi32(h2, h0, 0x10), h1, 0x20), h3,
                              0x80);
    __m256i digit[8];
    for (int k = 0; k < 8; ++k)
      digit[k] = _mm256_sub_epi8(
          _mm256_setzero_si256(),
          _mm256_add_epi8(_mm256_cmpgt_epi8(v[k], lo1), _mm256_cmpgt_epi8(v[k], lo2)));
    const float dx = fp16_to_fp32(x[b].d);
    for (int t = 0; t < N; ++t) {
      const BlockQ8K& yb = ys[t][b];
      __m256i acc = _mm256_sub_epi16(_mm256_setzero_si256(), load(yb.bsums));
      for (int k = 0; k < 8; ++k)
        acc = _mm256_add_epi16(acc, _mm256_maddubs_epi16(digit[k], load(yb.qs + 32 * k)));
      const int sum = hsum_i32(_mm256_madd_epi16(acc, _mm256_set1_epi16(1)));
      s[t] += static_cast<float>(sum) * (dx * yb.d);
    }
  }
  for (int t = 0; t < N; ++t) out[t] = s[t];
}
}  // namespace

EXPERTD_ROWS_KERNEL(tq1_0, BlockTq1_0, BlockQ8K, tq1_0_rows)

}  // namespace kernels::avx2

namespace kernels::avx2 {

// q in 0..63 suits maddubs; the -32 offset comes off as 32 x the scaled 16-element sums of the
// activations, in eight i32 lanes.
template <int N>
void q6k_rows(const BlockQ6K* x, const BlockQ8K* const* ys, int64_t n, float* out) {
  const __m256i m4 = _mm256_set1_epi8(0xF), m2 = _mm256_set1_epi8(3);
  sb_rows<N, false>(
      x, sizeof(BlockQ6K), offsetof(BlockQ6K, d), 0, n, ys, 1.0f, out,
      [&](int64_t b, __m256i* I, __m256i*) {
        const __m128i s8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x[b].scales));
        const ScalePairs sc(s8);
        const __m256i s16 = _mm256_cvtepi8_epi16(s8);
        const uint8_t* ql = x[b].ql;
        const uint8_t* qh = x[b].qh;
        for (int half = 0; half < 2; ++half, ql += 64, qh += 32) {
          const __m256i l0 = load(ql), l1 = load(ql + 32), h = load(qh);
          const __m256i q[4] = {
              _mm256_or_si256(_mm256_and_si256(l0, m4),
                              _mm256_slli_epi16(_mm256_and_si256(h, m2), 4)),
              _mm256_or_si256(_mm256_and_si256(l1, m4),
                              _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), m2), 4)),
              _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                              _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), m2), 4)),
              _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                              _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), m2), 4))};
          for (int g = 0; g < 4; ++g) {
            const __m256i scale = sc(4 * half + g);
            for (int t = 0; t < N; ++t)
              I[t] = _mm256_add_epi32(
                  I[t],
                  _mm256_madd_epi16(
                      scale, _mm256_maddubs_epi16(q[g], load(ys[t][b].qs + 128 * half + 32 * g))));
          }
        }
        for (int t = 0; t < N; ++t)  // the -32 offset: 32 x the scaled 16-element sums
          I[t] = _mm256_sub_epi32(
              I[t], _mm256_slli_epi32(_mm256_madd_epi16(load(ys[t][b].bsums), s16), 5));
      });
}
EXPERTD_ROWS_KERNEL(q6_k, BlockQ6K, BlockQ8K, q6k_rows)

}  // namespace kernels::avx2

namespace kernels::avx2 {
namespace {
// IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S (iq_grids.h): per group of 32 the grid's magnitudes against the
// activations given the weights' signs, times the scales, into the super-block's exact integer
// sum (avx2.h's sb_rows, as the matrix-matrix panels compute it). N tokens share each decoded
// group: N = 1 is the dot, 2..4 the tile.
template <int N, class Block, bool kGather = false>
void grid_rows(const Block* x, const BlockQ8K* const* ys, int64_t n, float* out) {
  sb_rows<N, false>(
      x, sizeof(Block), 0, 0, n, ys, Grid<Block>::kPost, out, [&](int64_t b, __m256i* I, __m256i*) {
        for (int ib = 0; ib < 8; ++ib) {
          const GridGroup q = Grid<Block>::template group<kGather>(x[b], ib);
          const __m256i scale = _mm256_setr_m128i(_mm_set1_epi16(static_cast<int16_t>(q.s0)),
                                                  _mm_set1_epi16(static_cast<int16_t>(q.s1)));
          for (int t = 0; t < N; ++t) {
            const __m256i q8 = _mm256_sign_epi8(load(ys[t][b].qs + 32 * ib), q.sg);
            I[t] = _mm256_add_epi32(I[t], _mm256_madd_epi16(_mm256_maddubs_epi16(q.g, q8), scale));
          }
        }
      });
}
template <int N>
void iq2xs_rows(const BlockIq2Xs* x, const BlockQ8K* const* ys, int64_t n, float* out) {
  grid_rows<N>(x, ys, n, out);
}
template <int N>
void iq2s_rows(const BlockIq2S* x, const BlockQ8K* const* ys, int64_t n, float* out) {
  if (!gathers_slow()) return tile_iq2_s_gather(x, ys, N, n, out);
  grid_rows<N>(x, ys, n, out);
}
// IQ3_XXS and IQ3_S: their eight 4-byte grid rows a group gathered unless gathers are slow
// (iq_grids.h: iq3xxs_rows8, iq3s_rows8); IQ3_XXS's looked up one at a time also where rows are
// fetched by loads (AMD's family 19h: on a Zen 4, 2 threads from memory, 7.4-7.6 GB/s against the
// gather's 6.2-6.3; IQ3_S's rows, whose indices take more to make one at a time, gather faster
// there, 7.1-7.2 against 4.8-5.9).
template <int N>
void iq3xxs_rows(const BlockIq3Xxs* x, const BlockQ8K* const* ys, int64_t n, float* out) {
  gathers_slow() || gathers_by_loads() ? grid_rows<N, BlockIq3Xxs, false>(x, ys, n, out)
                                       : grid_rows<N, BlockIq3Xxs, true>(x, ys, n, out);
}
template <int N>
void iq3s_rows(const BlockIq3S* x, const BlockQ8K* const* ys, int64_t n, float* out) {
  gathers_slow() ? grid_rows<N, BlockIq3S, false>(x, ys, n, out)
                 : grid_rows<N, BlockIq3S, true>(x, ys, n, out);
}
}  // namespace

EXPERTD_ROWS_KERNEL(iq2_xs, BlockIq2Xs, BlockQ8K, iq2xs_rows)
EXPERTD_ROWS_KERNEL(iq2_s, BlockIq2S, BlockQ8K, iq2s_rows)
EXPERTD_ROWS_KERNEL(iq3_xxs, BlockIq3Xxs, BlockQ8K, iq3xxs_rows)
EXPERTD_ROWS_KERNEL(iq3_s, BlockIq3S, BlockQ8K, iq3s_rows)

}  // namespace kernels::avx2
