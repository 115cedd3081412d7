// Attention's softmax over one query's scores (and SwiGLU's exp), defined once for every
// instruction set: the reference (ref.cpp) computes it one value at a time with these steps, the
// SIMD bodies eight at a time with the same operations, so all give the same bits.
//   e_j = exp_score(s_j - max), max over the scores and the sink;
//   sum = (a0 + a1) + (a2 + a3), a_l the double sum of e_j over j = l (mod 4) in order, plus
//         exp_score(sink - max) when there is a sink;
//   s_j = e_j * float(1 / sum).
// exp_score: 2^n e^r with n = round(x log2 e) (ties to even), r = x - n ln 2 (ln 2 in two parts,
// the first exact when multiplied by n) and e^r by its Taylor polynomial of degree 7 (Horner, one
// FMA a step): within ~1 ulp of exp for x in [-87, 0] (the polynomial's truncation ~5e-9), and 0
// below -87 (where exp is below 2^-125, nothing beside the maximum's 1).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace kernels::attn_softmax {

inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2Hi = 0.693359375f;  // 355 / 512: n * kLn2Hi is exact
inline constexpr float kLn2Lo = -2.12194440e-4f;
inline constexpr float kFloor = -87.0f;
inline constexpr float kCeil = 88.0f;
inline constexpr float kTaylor[8] = {1.0f,      1.0f,       1.0f / 2,   1.0f / 6,
                                     1.0f / 24, 1.0f / 120, 1.0f / 720, 1.0f / 5040};

// The steps on x in [kFloor, kCeil].
inline float exp_steps(float x) {
  const float n = std::nearbyint(x * kLog2e);
  float r = std::fma(n, -kLn2Hi, x);
  r = std::fma(n, -kLn2Lo, r);
  float p = kTaylor[7];
  for (int i = 6; i >= 0; --i) p = std::fma(p, r, kTaylor[i]);
  return p * std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
}

inline float exp_score(float x) {
  return x >= kFloor ? exp_steps(x) : 0.0f;  // 0 for -inf (a masked score) and NaN too
}

// exp over the whole float range for SwiGLU's silu (x / (1 + e^-x)): the same steps on x clamped
// to [-87, 88] (e^88 < FLT_MAX; beyond either end silu is x or 0 within 1e-36).
inline float exp_clamped(float x) {
  if (x != x) return x;
  x = kFloor > x ? kFloor : x;  // the SIMD bodies' max(kFloor, x) and min(kCeil, x)
  return exp_steps(kCeil < x ? kCeil : x);
}

}  // namespace kernels::attn_softmax
